"""The front door: one reading per MQTT message, drained from the broker's queue.

Starts its own Mosquitto on a free loopback port. For each path a persistent session
(QoS 1, its own client id) is made, N messages are queued in the broker for it as
devices send them (``dqcep generate --profile iot --payload object`` to
``sensors/<type>/<device>``: one JSON object a message, no id, no time), and the path
drains the queue; messages/s from its first message to its N-th. The paths, one after
the other and alternating over ``--repeat`` rounds, so that the machine's load falls on
all of them:

- ``mosquitto_sub``: the broker's own C client (``-q 1 -C N``; its start included);
- ``raw reader``: a Python reader that does nothing else: recv 1 MiB, parse every
  packet, one ``sendall`` of the PUBACKs per read (what Python can do at all);
- ``raw + 2 ms commit``: the same, its PUBACKs sent 2 ms after each read (an fsync's
  time): what acknowledging only once durable costs when the acks of a whole read go
  out together (the broker's in-flight window decides how much one read holds);
- ``paho``: paho-mqtt doing nothing per message, QoS 1;
- ``receiving side``: dqcep's ``MqttSource`` and journal (fsync on), no engine;
- ``service 1 query`` and ``service 10 queries``: ``dqcep run ... --map`` (the docs'
  map shape) with ``overheating`` alone and with the 10 example queries (every query of
  ``examples/*.cep`` and ``dqcep/data/iot.cep`` over these sensors, the first of each
  name); until every event is taken in and every match found is written (the stats'
  ``output_backlog`` is 0);
- ``service 1 query --tick 0``: the same without ticks (spec section 7): a busy stream
  writes none, so the two should not differ;
- ``--workers 2``: the same 10 queries in two worker processes;
- ``spark stream``: ``dqcep spark stream`` (in this process, ``local[2]``) with the map
  and ``overheating`` over the journal the receiving side filled, its messages ten times
  over and 1 ms apart, cut into segments of 10%, 10%, 20% and 60% (one a micro-batch): the marginal
  events/s and the fixed cost of a micro-batch, from a line through the last three.

Each figure is printed with its ratio to the raw reader of the same round. Targets
(issue 51): the service with 1 query >= 0.25x the raw reader, with 10 queries >= 0.12x,
``--workers 2`` >= 1.3x one process, ``dqcep spark stream`` >= 100,000 events/s marginal
with a fixed cost <= 2 s a micro-batch.

    python3 bench/bench_front_door.py [--messages N] [--repeat R] [--paths a,b,...]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import Service, free_port, wait_port  # noqa: E402 - the same service harness

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from dqcep.io.mqtt_wire import remaining_length  # noqa: E402 - the raw reader's CONNECT
from tests.support.iot_queries import MAP, TOPIC, example_queries  # noqa: E402 - shared
TARGETS = {"service 1 query": 0.25, "service 10 queries": 0.12}
WORKERS_TARGET = 1.3


def make_session(port: int, client_id: str) -> None:
    """A persistent session subscribed to sensors/# with QoS 1, left at once: the broker
    queues what comes for it."""
    import paho.mqtt.client as mqtt

    subscribed = threading.Event()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                    clean_session=False)
    c.on_connect = lambda c, u, f, rc, p: c.subscribe("sensors/#", qos=1)
    c.on_subscribe = lambda *a: subscribed.set()
    _connected_until(c, port, subscribed, 10, f"{client_id}: no SUBACK")


def _connected_until(client, port: int, event: threading.Event, timeout: float,
                     why: str) -> None:
    """A paho client connected, its loop running, until ``event`` (else SystemExit)."""
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        if not event.wait(timeout):
            raise SystemExit(why)
    finally:
        client.disconnect()
        client.loop_stop()


def queue_messages(port: int, n: int) -> None:
    subprocess.run([sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n", str(n),
                    "--batch-size", "1", "--quiet", "--payload", "object",
                    "-o", f"mqtt://127.0.0.1:{port}/{TOPIC}"], check=True)


def raw_reader(port: int, client_id: str, n: int, commit: float = 0.0) -> float:
    """messages/s of a Python reader that parses every packet and acknowledges QoS 1;
    ``commit`` > 0: the PUBACKs of what it read wait that many seconds first (an
    fsync's time: acknowledged only once durable), read by read."""
    body = b"\x00\x04MQTT\x04\x00\x00\x3c" + struct.pack("!H", len(client_id)) + \
        client_id.encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"\x10" + remaining_length(len(body)) + body)
    buf, got, first = b"", 0, None
    connacked = False
    while got < n:
        data = s.recv(1 << 20)
        if not data:
            raise SystemExit("raw reader: the broker closed the connection")
        if first is None:
            first = time.perf_counter()
        buf += data
        pos, acks = 0, []
        while True:
            if pos + 2 > len(buf):
                break
            kind = buf[pos]
            length, mult, i = 0, 1, pos + 1
            while True:
                if i >= len(buf):
                    length = -1
                    break
                b = buf[i]
                length += (b & 0x7F) * mult
                mult *= 128
                i += 1
                if not b & 0x80:
                    break
            if length < 0 or i + length > len(buf):
                break
            if kind >> 4 == 3:  # PUBLISH
                if (kind >> 1) & 3:
                    topic_len = struct.unpack_from("!H", buf, i)[0]
                    acks.append(b"\x40\x02" + buf[i + 2 + topic_len:i + 4 + topic_len])
                got += 1
            elif kind >> 4 == 2:
                connacked = True
            pos = i + length
        buf = buf[pos:]
        if acks:
            if commit:
                time.sleep(commit)
            s.sendall(b"".join(acks))
    elapsed = time.perf_counter() - first
    s.sendall(b"\xe0\x00")
    s.close()
    assert connacked
    return n / elapsed


def paho_reader(port: int, client_id: str, n: int) -> float:
    import paho.mqtt.client as mqtt

    done, count, first = threading.Event(), [0], []

    def on_message(client, userdata, msg):
        if not first:
            first.append(time.perf_counter())
        count[0] += 1
        if count[0] >= n:
            first.append(time.perf_counter())
            done.set()

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                    clean_session=False)
    c.on_message = on_message
    _connected_until(c, port, done, 600, f"paho: fewer than {n} messages in 600 s")
    return n / (first[1] - first[0])


def mosquitto_sub(port: int, client_id: str, n: int) -> float:
    binary = shutil.which("mosquitto_sub")
    started = time.perf_counter()
    subprocess.run([binary, "-h", "127.0.0.1", "-p", str(port), "-q", "1", "-c", "-i",
                    client_id, "-t", "sensors/#", "-C", str(n)], check=True,
                   stdout=subprocess.DEVNULL)
    return n / (time.perf_counter() - started)


def receiving_side(port: int, client_id: str, n: int, tmp: Path) -> float:
    """dqcep's MqttSource and journal (fsync on) alone: messages/s until N are durable."""
    from dqcep.io.journal import Journal
    from dqcep.io.mqtt import MqttSource, MqttUrl

    journal = Journal(tmp / f"{client_id}.journal")
    source = MqttSource([MqttUrl.parse(f"mqtt://127.0.0.1:{port}/sensors/#", subscribe=True)],
                        journal, client_id=client_id)
    source.start()
    first = None
    try:
        while journal.durable_offset < n:
            if first is None and journal.durable_offset:
                first = (time.perf_counter(), journal.durable_offset)
            time.sleep(0.001)
        last = time.perf_counter()
    finally:
        source.stop()
        journal.close()
    t0, n0 = first or (last, n)
    return (n - n0) / max(last - t0, 1e-9)


def spark_stream(port: int, client_id: str, n: int, tmp: Path, queries: Path) -> float:
    """``dqcep spark stream`` (run_stream, in this process, ``local[2]``, ``queries``) with the map
    over the journal the receiving side fills with the queued messages, SPARK_SCALE times
    over and 1 ms apart, cut into closed segments (Spark reads one a micro-batch):
    10% to warm up, 10%, 20%, 60% (1,000,000 records for 100,000 messages).
    Returns the marginal events/s of the three measured micro-batches (a line fitted
    to their rows and seconds); ``SPARK_FIXED`` gets each round's fixed cost a
    micro-batch (the line at 0 rows)."""
    from dqcep.io.journal import Journal, read_journal
    from dqcep.io.mapping import TopicMap
    from dqcep.spark.session import spark_session
    from dqcep.spark.stream import run_stream

    receiving_side(port, client_id, n, tmp)
    records = list(read_journal(tmp / f"{client_id}.journal", include_open=True))[:n]
    journal_dir = tmp / f"{client_id}.segments"
    journal = Journal(journal_dir, segment_bytes=1, fsync="never")  # a commit closes one
    # the messages again and again, 1 ms apart: drained from a queue, they arrived
    # within a second, and a window of every query would hold all of them
    total = SPARK_SCALE * n
    start = records[0].arrival_us
    cuts = {total // 10, total // 5, 2 * total // 5, total}
    for i in range(total):
        r = records[i % n]
        journal.append(r.topic, r.payload, start + 1000 * i, r.mid)
        if i + 1 in cuts:
            journal.commit()
    journal.close()
    spark = spark_session("local[2]", "bench-front-door", 2)
    try:
        query = run_stream(spark, queries.read_text(), str(journal_dir),
                           str(tmp / f"{client_id}.out"), str(tmp / f"{client_id}.ck"),
                           partitions=2,
                           topic_map=TopicMap.parse(MAP, "map.toml"), until_idle=True)
        batches = [(p["numInputRows"], p["durationMs"]["triggerExecution"] / 1000)
                   for p in (json.loads(q.json) for q in query.recentProgress)
                   if p["numInputRows"]]
    finally:
        spark.stop()
    if len(batches) < 4:
        raise SystemExit(f"spark stream: {len(batches)} micro-batches with rows, not 4")
    SPARK_BATCHES.append(batches)
    rows, seconds = np.array(batches[1:4]).T  # (the first warms up)
    slope, fixed = np.polyfit(rows, seconds, 1)  # seconds = fixed + rows * slope
    SPARK_FIXED.append(fixed)
    return 1 / slope if slope > 0 else float("inf")


SPARK_FIXED: list[float] = []  # s per micro-batch, one a round
SPARK_BATCHES: list[list] = []  # (rows, s) of each micro-batch with rows, one list a round
SPARK_TARGET, SPARK_FIXED_TARGET = 100_000, 2.0
SPARK_SCALE = 10  # the spark path reads the queued messages this many times over


class MappedService(Service):
    """bench_ingest's service on another queries file, started without waiting for its
    first line (a coordinator of workers says more before it): the stats file tells."""

    def __init__(self, tmp: Path, url: str, client_id: str, queries: Path, extra=()):
        super().__init__(tmp, url, client_id, extra)
        self.cmd[4] = str(queries)
        self.log = tmp / "stderr.log"

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stderr=open(self.log, "w"), text=True)
        self.proc.stderr = open(self.log)  # rate_until reads it if the service stops


def service(port: int, client_id: str, n: int, tmp: Path, queries: Path, workers: int = 0,
            options=()) -> float:
    (tmp / "map.toml").write_text(MAP)
    extra = ["--map", str(tmp / "map.toml"), *options] + \
        (["--workers", str(workers)] if workers else [])
    svc = MappedService(tmp / client_id, f"mqtt://127.0.0.1:{port}/sensors/#", client_id,
                        queries, extra)
    try:
        svc.start()
        rate, stats = svc.rate_until(n, written=True)
        if stats.get("malformed"):
            raise SystemExit(f"{client_id}: {stats['malformed']} payloads dead-lettered")
        return rate
    finally:
        if svc.proc is not None and svc.proc.poll() is None:
            svc.stop()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=2, help="rounds over every path")
    ap.add_argument("--paths", default=None, help="comma-separated names (default: all)")
    args = ap.parse_args(argv)
    n = args.messages
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        one, ten = tmp / "one.cep", tmp / "ten.cep"
        from dqcep.lang import parse_file, to_source
        one.write_text(to_source(parse_file(str(ROOT / "dqcep/data/iot.cep")).queries[0]) + "\n")
        n_queries = example_queries(ten)
        paths = {
            "mosquitto_sub": lambda cid: mosquitto_sub(port, cid, n),
            "raw reader": lambda cid: raw_reader(port, cid, n),
            "raw + 2 ms commit": lambda cid: raw_reader(port, cid, n, commit=0.002),
            "paho": lambda cid: paho_reader(port, cid, n),
            "receiving side": lambda cid: receiving_side(port, cid, n, tmp),
            "service 1 query": lambda cid: service(port, cid, n, tmp, one),
            "service 1 query --tick 0": lambda cid: service(port, cid, n, tmp, one,
                                                             options=("--tick", "0")),
            "service 10 queries": lambda cid: service(port, cid, n, tmp, ten),
            "--workers 2": lambda cid: service(port, cid, n, tmp, ten, workers=2),
            "spark stream": lambda cid: spark_stream(port, cid, n, tmp, one),
        }
        chosen = list(paths) if args.paths is None else args.paths.split(",")
        if "mosquitto_sub" in chosen and not shutil.which("mosquitto_sub"):
            print("mosquitto_sub left out: not installed (Debian: apt-get install "
                  "mosquitto-clients)", file=sys.stderr)
            chosen.remove("mosquitto_sub")
        if "spark stream" in chosen and importlib.util.find_spec("pyspark") is None:
            print("spark stream left out: PySpark is not installed (pip install -e '.[spark]')",
                  file=sys.stderr)
            chosen.remove("spark stream")
        if "raw reader" not in chosen:
            chosen.insert(0, "raw reader")  # every ratio is to it
        port = free_port()
        (tmp / "m.conf").write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                                    "max_queued_messages 0\n")
        broker = subprocess.Popen([binary, "-c", str(tmp / "m.conf")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rates: dict[str, list[float]] = {p: [] for p in chosen}
        ratios: dict[str, list[float]] = {p: [] for p in chosen}
        try:
            wait_port(port)
            for r in range(args.repeat):
                for i, name in enumerate(chosen):
                    cid = f"door-{r}-{i}"
                    make_session(port, cid)  # (the service resumes it: same id, filter)
                    queue_messages(port, n)
                    rates[name].append(paths[name](cid))
                raw = rates["raw reader"][-1]
                for name in chosen:
                    ratios[name].append(rates[name][-1] / raw)
        finally:
            broker.terminate()
            broker.wait(10)
    print(f"messages={n:,}, one reading each (sensors/<type>/<device>, a JSON object, no id "
          f"or time), queued in Mosquitto and drained; {args.repeat} rounds, alternating; "
          f"the 10 queries: {n_queries} found")
    for name in chosen:
        med = statistics.median(rates[name])
        ratio = statistics.median(ratios[name])
        line = (f"{name:>20}: {med:>9,.0f} messages/s  {ratio:5.2f}x the raw reader  (runs: "
                f"{', '.join(f'{x:,.0f}' for x in rates[name])})")
        if name in TARGETS:
            line += f"  target >= {TARGETS[name]}x: {'met' if ratio >= TARGETS[name] else 'NOT met'}"
        print(line)
    if SPARK_FIXED:
        fixed = statistics.median(SPARK_FIXED)
        mid = statistics.median(rates["spark stream"])
        print(f"spark stream (events/s above: marginal, 1 query): {mid:,.0f} events/s "
              f"(target >= {SPARK_TARGET:,}: {'met' if mid >= SPARK_TARGET else 'NOT met'}), "
              f"fixed {fixed:.2f} s a micro-batch (target <= {SPARK_FIXED_TARGET:g} s: "
              f"{'met' if fixed <= SPARK_FIXED_TARGET else 'NOT met'}; runs: "
              f"{', '.join(f'{x:.2f}' for x in SPARK_FIXED)}); micro-batches (rows, s): "
              f"{SPARK_BATCHES}")
    if "service 1 query --tick 0" in rates and "service 1 query" in rates:
        t = statistics.median(a / b for a, b in zip(rates["service 1 query"],
                                                     rates["service 1 query --tick 0"]))
        print(f"ticks on (--tick 1000, the default) / off (--tick 0), 1 query: {t:.2f}x "
              "(a busy stream writes no tick: ~1.00x)")
    if "--workers 2" in rates and "service 10 queries" in rates:
        w = statistics.median(a / b for a, b in zip(rates["--workers 2"],
                                                     rates["service 10 queries"]))
        print(f"--workers 2 / one process, 10 queries: {w:.2f}x (target >= {WORKERS_TARGET}x: "
              f"{'met' if w >= WORKERS_TARGET else 'NOT met'})")


if __name__ == "__main__":
    main()
