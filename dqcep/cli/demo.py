"""``dqcep demo``: the generator's IoT stream through the engine, no services needed.

Generates an IoT sensor stream (``generator``, profile iot) with planted
occurrences of the demo queries (``dqcep/data/iot.cep``), runs it through the
native engine in-process, prints a sample of the matches, the matches per query,
the share of planted occurrences found (recall), and the engine's figures; with
``--mqtt``, through a real broker and the streaming service.
"""
from __future__ import annotations

import sys
import time
from importlib import resources

from dqcep.core.errors import UserError
from dqcep.core.limits import COUNT, NON_NEGATIVE_COUNT

DEMO_QUERIES = "iot.cep"
PLANT_EVERY_MS = 130_000  # > 2 x (window + skew) of every demo query
DEVICE_RATE = 5_000  # readings/s the MQTT demo's devices send, one message each


def demo_queries_path() -> str:
    return str(resources.files("dqcep.data") / DEMO_QUERIES)


def run_demo(events: int = 200_000, seed: int = 1, show: int = 10, out=sys.stdout) -> int:
    from dqcep.io.match_text import match_line
    from dqcep.lang import parse_file
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine
    from dqcep.generator import GeneratorConfig, Planting, StreamGenerator

    path = demo_queries_path()
    queries = parse_file(path).queries
    gen = StreamGenerator(GeneratorConfig(profile="iot", events=events, seed=seed,
                                          plant=Planting(queries=path, every=PLANT_EVERY_MS)))
    engine = Engine(build_plan(queries))
    print(f"dqcep demo: {events:,} IoT sensor events (profile iot, seed {seed}), "
          f"queries from {path}:", file=out)
    for q in queries:
        print(f"  {q.name}", file=out)
    found: set[tuple] = set()
    counts = {q.name: 0 for q in queries}
    shown, busy = 0, 0.0

    def take(batch):
        nonlocal shown
        for m in batch.to_matches():
            counts[m.query] += 1
            found.add((m.query, frozenset(m.events)))
            if shown < show:
                print("  " + match_line(m), file=out)
                shown += 1

    print(f"\nfirst {show} matches:", file=out)
    for batch in gen.batches(16_384):
        t0 = time.perf_counter()
        result = engine.process(batch)
        busy += time.perf_counter() - t0
        take(result)
    t0 = time.perf_counter()
    take(engine.flush())
    busy += time.perf_counter() - t0
    planted = [(t["query"], frozenset(t["events"].items())) for t in gen.truth]
    recalled = sum(1 for p in planted if p in found)
    print("\nmatches per query:", file=out)
    for name, n in counts.items():
        print(f"  {name:<12} {n:>8,}", file=out)
    print(f"\nplanted occurrences found: {recalled} of {len(planted)}", file=out)
    print(f"engine: {engine.events_in:,} events in {busy:.2f} s "
          f"({engine.events_in / busy:,.0f} events/s), peak state "
          f"{engine.peak_state_bytes / 1e6:.1f} MB, late {engine.late}", file=out)
    return 0 if recalled == len(planted) else 1


def _reachable(host: str, port: int) -> bool:
    import socket
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _start_mosquitto(workdir):
    """A Mosquitto of our own on a free loopback port, or None if it is not installed."""
    import shutil
    import socket
    import subprocess

    binary = shutil.which("mosquitto") or ("/usr/sbin/mosquitto"
                                           if shutil.which("/usr/sbin/mosquitto") else None)
    if binary is None:
        return None, None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = workdir / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages 0\n")
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not _reachable("127.0.0.1", port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            return None, None
        time.sleep(0.05)
    return proc, port


def run_demo_mqtt(events: int = 50_000, seed: int = 1, show: int = 10,
                  broker: str | None = None, out=sys.stdout) -> int:
    """The demo over a real broker as devices use one: generator -> one MQTT message per
    reading (topic ``.../<type>``, a JSON object of the reading's attributes and its
    device's time, no id) -> the streaming service with a map -> matches."""
    import json
    import tempfile
    import threading
    from pathlib import Path

    from dqcep.core.events import event_from_mapping
    from dqcep.io.event_writers import BatchEncoder
    from dqcep.io.mapping import ID_SHIFT, TopicMap
    from dqcep.io.mqtt import MqttPublisher, MqttUrl
    from dqcep.io.publish import Pacer, PayloadShape, TopicTemplate, messages
    from dqcep.service import ServiceConfig, StreamingService
    from dqcep.generator import GeneratorConfig, Planting, StreamGenerator

    with tempfile.TemporaryDirectory(prefix="dqcep-demo-") as tmp:
        tmp = Path(tmp)
        proc = None
        if broker:
            host, _, port_text = broker.rpartition(":")
            if not host or not port_text.isdigit():
                raise UserError(f"--broker must be HOST:PORT, got {broker!r}")
            host, port = host, int(port_text)
            if not _reachable(host, port):
                raise UserError(f"cannot reach the MQTT broker at {broker}")
        elif _reachable("127.0.0.1", 1883):
            host, port = "127.0.0.1", 1883
        else:
            proc, port = _start_mosquitto(tmp)
            host = "127.0.0.1"
            if proc is None:
                raise UserError(
                    "dqcep demo --mqtt needs an MQTT broker: none answers on localhost:1883 "
                    "and Mosquitto is not installed. Install it (Debian/Ubuntu: "
                    "sudo apt-get install mosquitto; macOS: brew install mosquitto) or give "
                    "--broker HOST:PORT. `dqcep demo` without --mqtt needs no broker.")
        try:
            where = f"{host}:{port}" + (" (a Mosquitto started for the demo)" if proc else "")
            print(f"dqcep demo --mqtt: broker {where}", file=out)
            root = f"dqcep-demo/{time.time_ns()}"
            # the map: the topic's last level is the event type, the time is the device's
            (tmp / "map.toml").write_text(f'[[topic]]\nfilter = "{root}/+"\n'
                                          'levels = "_/_/type"\nts = "time"\n')
            print(f"devices publish one reading per message to {root}/<type>, e.g. "
                  '{"room": "site1/room2", "value": 21.5, ..., "time": <ms>}, no id; '
                  "the service reads them through a map", file=out)
            path = demo_queries_path()
            svc = StreamingService(ServiceConfig(
                queries=path, inputs=[f"mqtt://{host}:{port}/{root}/+"],
                journal=str(tmp / "journal"), checkpoint=str(tmp / "checkpoint"),
                output=str(tmp / "matches.jsonl"), dead_letter=str(tmp / "dead.jsonl"),
                late=str(tmp / "late.jsonl"), stats_every=3600,
                topic_map=TopicMap.load(tmp / "map.toml"),
                client_id=f"dqcep-demo-{time.time_ns()}"))
            stop, end_of_stream = threading.Event(), threading.Event()
            worker = threading.Thread(target=svc.run, args=(stop, end_of_stream), daemon=True)
            worker.start()
            time.sleep(0.5)
            gen = StreamGenerator(GeneratorConfig(profile="iot", events=events, seed=seed,
                                                  plant=Planting(queries=path,
                                                                 every=PLANT_EVERY_MS)))
            publisher = MqttPublisher(MqttUrl.parse(f"mqtt://{host}:{port}/{root}"))
            encoder = BatchEncoder(gen.schema, "jsonl", 1000)
            template = TopicTemplate(f"{root}/{{type}}")
            shape = PayloadShape("object", time_field="time")
            sent: list[int] = []  # the generator's ids in journal order
            # paced below what the service takes in one message at a time: a broker
            # with Mosquitto's default queue (1000 messages a session) drops the rest
            pacer = Pacer(DEVICE_RATE)
            started = time.perf_counter()
            for batch in gen.batches(1000):
                readings = [(f"event {obj['id']}", event_from_mapping(obj))
                            for obj, _ in encoder.rows(batch)]
                sent += [e.id for _, e in readings]
                pacer.wait(len(readings))
                for topic, payload in messages(readings, template, shape):
                    publisher.publish(payload, topic=topic)
            publisher.close()
            deadline = time.monotonic() + 120
            while svc.counts["events_in"] < events and time.monotonic() < deadline:
                time.sleep(0.05)
            end_of_stream.set()  # the demo's stream is over: held matches out
            worker.join(60)
            elapsed = time.perf_counter() - started
            lines = (tmp / "matches.jsonl").read_text().splitlines()
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(10)
    # the service's ids come from the journal (offset << 24): message k is reading k
    matches = []
    for line in lines:
        m = json.loads(line)
        m["events"] = {v: sent[i >> ID_SHIFT] for v, i in m["events"].items()}
        matches.append(m)
    print(f"\n{svc.counts['events_in']:,} of {events:,} events arrived over MQTT; first "
          f"{min(show, len(matches))} matches (ids: the generator's, from the journal's):",
          file=out)
    for m in matches[:show]:
        print("  " + json.dumps(m), file=out)
    counts: dict[str, int] = {}
    found = set()
    for m in matches:
        counts[m["query"]] = counts.get(m["query"], 0) + 1
        found.add((m["query"], frozenset(m["events"].items())))
    print("\nmatches per query:", file=out)
    for name, n in sorted(counts.items()):
        print(f"  {name:<12} {n:>8,}", file=out)
    planted = [(t["query"], frozenset(t["events"].items())) for t in gen.truth]
    recalled = sum(1 for p in planted if p in found)
    print(f"\nplanted occurrences found: {recalled} of {len(planted)}", file=out)
    print(f"publish -> match: {events / elapsed:,.0f} events/s end to end, one message "
          "per reading", file=out)
    return 0 if recalled == len(planted) and svc.counts["events_in"] == events else 1


def add_parser(sub) -> None:
    """``dqcep demo``."""
    demo = sub.add_parser(
        "demo", help="run example queries over a generated IoT stream (no services needed)",
        description="Generate an IoT sensor stream with planted occurrences of the demo "
        "queries (dqcep/data/iot.cep), run it through the native engine and print matches, "
        "recall of the planted occurrences and the engine's figures.")
    demo.add_argument("--events", "-n", type=COUNT.option, default=None,
                      help="events to generate (default 200000; 50000 with --mqtt)")
    demo.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    demo.add_argument("--show", type=NON_NEGATIVE_COUNT.option, default=10, help="matches to print (default 10)")
    demo.add_argument("--mqtt", action="store_true",
                      help="go through a real MQTT broker and the streaming service: the one "
                      "at --broker, else localhost:1883, else a Mosquitto started for the demo")
    demo.add_argument("--broker", metavar="HOST:PORT", help="the MQTT broker for --mqtt")
    demo.set_defaults(func=command)


def command(args) -> int:
    if args.events is None:
        args.events = 50_000 if args.mqtt else 200_000
    if args.events < 1:
        raise UserError("--events must be >= 1")
    if args.mqtt:
        return run_demo_mqtt(args.events, args.seed, args.show, args.broker)
    if args.broker:
        raise UserError("--broker goes with --mqtt")
    return run_demo(args.events, args.seed, args.show)
