"""Real sensor feeds (--map) through a real Mosquitto: ESPHome values, zigbee2mqtt state
objects, Tasmota nested objects, with and without payload times, no ids; the service
and the workers SIGKILLed twice mid-stream give exactly the reference's matches (the
streaming Spark job on such a journal: tests/spark/test_spark.py)."""
from __future__ import annotations

import json
import time

import pytest

from dqcep.core.events import Event
from dqcep.io.journal import Journal, read_journal
from dqcep.io.mapping import TopicMap, derived_id
from dqcep.io.mqtt import MqttSource, MqttUrl
from dqcep.io.mqtt_wire import publish_packet
from tests.support.feeds import MAP, QUERIES, ROOT, Publisher, expected, feed
from tests.support.service import Workers

# Each test here starts processes or a broker: the quick run leaves them out.
pytestmark = pytest.mark.integration

@pytest.mark.parametrize("workers", [None, 2], ids=["service", "workers"])
def test_device_feeds_mapped_exactly_once_across_two_kills(mosquitto, tmp_path, workers):
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/"
    svc = Workers(tmp_path, url + "sensors/#", "--input", url + "zigbee2mqtt/+",
                  "--input", url + "tele/+/SENSOR", "--map", str(MAP), "--lateness", "30000",
                  "--client-id", f"feeds-{workers}", "--returns",
                  *(["--workers", str(workers)] if workers else []))
    svc.args[4] = str(QUERIES)
    journal = tmp_path / "state" / "journal"
    n = 1500
    svc.start()
    pub = Publisher(host, port, n)
    pub.start()
    for share in (0.3, 0.6):  # SIGKILL twice mid-stream, restart at once
        while len(pub.sent) < share * n and pub.is_alive():
            time.sleep(0.01)
        pub.running.clear()  # what is in flight at the kill, not a burst (Publisher)
        svc.proc.kill()
        svc.proc.wait()
        svc.log.write("--- restart ---\n")
        svc.log.flush()
        svc.start()
        pub.running.set()
    pub.join(60)
    assert pub.error is None and len(pub.sent) == n
    deadline = time.monotonic() + 60
    while len(list(read_journal(journal, include_open=True))) < n:
        assert time.monotonic() < deadline, "not every message was journaled"
        time.sleep(0.1)
    svc.finish()  # the end of the stream: what is journaled is drained, held matches out
    want = expected(journal, pub.sent, with_returns=True)
    assert len(want) > 20
    lines = [line for path in sorted(tmp_path.glob("out*.jsonl"))
             for line in path.read_text().splitlines()]
    assert len(lines) == len(set(lines)), "a match was written twice"
    assert set(lines) == want  # RETURN values equal the reference's too
    # the misdeclared probes, and nothing else, are dead letters (with --workers: of the
    # query that reads Probe)
    misdeclared = {i for i, (_, _, intent) in enumerate(pub.sent) if intent is None}
    dead = [json.loads(x) for p in (tmp_path / "state").rglob("dead-letter.jsonl")
            for x in p.read_text().splitlines()]
    assert sorted(d["offset"] for d in dead) == sorted(misdeclared) and misdeclared
    assert {d["reason"] for d in dead} == {
        "Probe.DS18B20_Temperature is declared DOUBLE, got a string"}


def test_a_redelivered_message_is_not_journaled_twice(tmp_path):
    topic = "sensors/r1/T"
    journal = Journal(tmp_path, fsync="never")
    source = MqttSource([MqttUrl.parse("mqtt://127.0.0.1/sensors/#", subscribe=True)], journal)
    source.take(publish_packet(topic, b'{"value": 1}', 7))
    journal.commit()
    # a new run after a crash between the commit and the PUBACK: the broker sends it again
    again = MqttSource([MqttUrl.parse("mqtt://127.0.0.1/sensors/#", subscribe=True)], journal)
    again.take(publish_packet(topic, b'{"value": 1}', 7, dup=True)     # the same: dropped
               + publish_packet(topic, b'{"value": 2}', 7, dup=True)   # another payload: kept
               + publish_packet(topic, b'{"value": 1}', 8))            # new: kept
    journal.commit()
    assert [(r.mid, r.payload) for r in journal.read()] == [
        (7, b'{"value": 1}'), (7, b'{"value": 2}'), (8, b'{"value": 1}')]
    assert again.redelivered == 1   # and every one is acknowledged, in order:
    assert again.intake.acks == [b"\x40\x02\x00\x07" * 2 + b"\x40\x02\x00\x08"]
    journal.close()


def test_the_example_map_reads_every_shape_of_the_feed():
    topic_map = TopicMap.load(MAP)
    from dqcep.io.journal import Record
    for i, (topic, payload, intent) in enumerate(feed(200)):
        events, bad = topic_map.read(Record(i, topic, payload, 1_000_000, None))
        if intent is None:  # a probe's "n/a": an event, which its declared type refuses
            assert bad == [] and events[0].attrs["DS18B20_Temperature"] == "n/a"
            continue
        etype, attrs, ts = intent
        assert bad == [] and events == [Event(derived_id(i, 0), etype,
                                              1000 if ts is None else ts, attrs)]


def test_publish_and_generate_send_device_shapes_the_service_maps_back(mosquitto, tmp_path):
    """``dqcep publish`` and ``dqcep generate`` with a topic template and object payloads
    send the same messages; the service reads them back through a map into the file's
    events (ids derived from the journal: its offsets are the file's lines) and finds
    ``dqcep run``'s matches on the file."""
    import subprocess
    import sys

    from tests.support.broker import subscribed
    host, port = mosquitto
    iot = ROOT / "dqcep" / "data" / "iot.cep"
    gen = [sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n", "3000",
           "--seed", "5", "--plant", str(iot), "--plant-every", "130000", "--quiet",
           "--truth", str(tmp_path / "truth.jsonl")]
    events_file = tmp_path / "events.jsonl"
    subprocess.run(gen + ["-o", str(events_file)], check=True)
    shape = ["--payload", "object", "--time", "t:ms"]
    with subscribed(host, port, "gen/#", "gen-watch", True) as from_generate:
        subprocess.run(gen + ["-o", f"mqtt://{host}:{port}/gen/{{type}}", *shape], check=True)
        deadline = time.monotonic() + 20
        while len(from_generate) < 3000 and time.monotonic() < deadline:
            time.sleep(0.05)
    (tmp_path / "map.toml").write_text(
        '[[topic]]\nfilter = "sensors/+"\nlevels = "_/type"\nts = "t"\n')
    svc = Workers(tmp_path, f"mqtt://{host}:{port}/sensors/+", "--map",
                  str(tmp_path / "map.toml"), "--client-id", "publish-shapes")
    svc.args[4] = str(iot)
    svc.start()
    with subscribed(host, port, "sensors/#", "pub-watch", True) as from_publish:
        subprocess.run([sys.executable, "-m", "dqcep", "publish", str(events_file),
                        f"mqtt://{host}:{port}/sensors/{{type}}", *shape, "--quiet"],
                       check=True)
        deadline = time.monotonic() + 20
        while len(from_publish) < 3000 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(from_publish) == 3000 and [(t.replace("sensors/", "gen/"), p) for t, p in
                                          from_publish] == from_generate
    svc.wait_for(3000)
    svc.finish()
    lines = events_file.read_text().splitlines()
    file_ids = [json.loads(x)["id"] for x in lines]
    first = json.loads(lines[0])
    assert from_publish[0][0] == f"sensors/{first['type']}" and json.loads(from_publish[0][1]) == {
        **{k: v for k, v in first.items() if k not in ("id", "type", "ts")}, "t": first["ts"]}
    got = set()
    for line in (tmp_path / "out.jsonl").read_text().splitlines():
        m = json.loads(line)
        m["events"] = {v: file_ids[i >> 24] for v, i in m["events"].items()}
        got.add(json.dumps(m))
    run = subprocess.run([sys.executable, "-m", "dqcep", "run", str(iot), "-i",
                          str(events_file)], check=True, capture_output=True, text=True)
    want = {json.dumps(json.loads(x)) for x in run.stdout.splitlines()}
    assert got == want and len(want) > 5


@pytest.mark.parametrize("workers", [None, 2], ids=["service", "workers"])
def test_the_compiled_map_gives_a_file_runs_matches_on_the_example_queries(mosquitto,
                                                                           tmp_path, workers):
    """One reading a message as devices send it (the docs' map shape), the 10 example
    queries: the service, whose journal the compiled map reads in blocks, writes
    exactly the matches ``dqcep run`` finds in a file of the events the map reads from
    that journal in Python (issue 51: the matches are today's)."""
    import subprocess
    import sys

    from tests.support.iot_queries import MAP as IOT_MAP
    from tests.support.iot_queries import TOPIC, example_queries
    host, port = mosquitto
    queries, map_file = tmp_path / "ten.cep", tmp_path / "map.toml"
    assert example_queries(queries) == 10
    map_file.write_text(IOT_MAP)
    journal = tmp_path / "journal"
    run = [sys.executable, "-m", "dqcep", "run", str(queries)]
    svc = subprocess.Popen(run + ["--input", f"mqtt://{host}:{port}/sensors/#", "--map",
                                  str(map_file), "--journal", str(journal), "--checkpoint",
                                  str(tmp_path / "ck"), "-o", str(tmp_path / "service.jsonl"),
                                  "--until-idle", "3", "--client-id", f"compiled-{workers}",
                                  *(["--workers", str(workers)] if workers else [])],
                           stderr=subprocess.PIPE, text=True)
    try:
        while "listening" not in (line := svc.stderr.readline()):
            assert line, "the service did not start"
        subprocess.run([sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n",
                        "3000", "--batch-size", "1", "--quiet", "--payload", "object", "-o",
                        f"mqtt://{host}:{port}/{TOPIC}"], check=True, timeout=120)
        assert svc.wait(120) == 0, svc.stderr.read()
    finally:
        if svc.poll() is None:
            svc.kill()
    topic_map = TopicMap.parse(IOT_MAP, "map.toml")
    events = [e for r in read_journal(journal) for e in topic_map.read(r)[0]]
    assert len(events) == 3000
    (tmp_path / "events.jsonl").write_text(
        "".join(json.dumps(e.as_mapping()) + "\n" for e in events))
    subprocess.run(run + ["--input", str(tmp_path / "events.jsonl"), "-o",
                          str(tmp_path / "file.jsonl")], check=True, timeout=300)
    service = [line for path in sorted(tmp_path.glob("service*.jsonl"))
               for line in path.read_text().splitlines()]
    file_run = (tmp_path / "file.jsonl").read_text().splitlines()
    assert len(file_run) > 100 and sorted(service) == sorted(file_run)
    queries_matched = {json.loads(line)["query"] for line in file_run}
    assert len(queries_matched) >= 5, queries_matched
