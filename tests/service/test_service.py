"""The streaming service against a real Mosquitto: end to end, SIGKILL + restart, dead letters."""
import json
import os
import subprocess
import sys
import time

import msgpack
import pytest

from dqcep.core.events import event_from_mapping
from dqcep.lang import parse_file
from dqcep.baseline.reference import ReferenceMatcher
from tests.support.broker import (free_port, start_mosquitto, stop_mosquitto,
                                  subscribed)
from tests.support.journal_service import rejected_events
from tests.support.workloads import SECTION5
from tests.support.service import Service, expected_matches, gen_args, publish_all
from tests.support.paths import ROOT

# Each test here starts processes or a broker: the quick run leaves them out.
pytestmark = pytest.mark.integration

QUERIES = ROOT / "dqcep" / "data" / "iot.cep"


def run_small_stream(tmp_path, url, events=5_000):
    """Service up, the generator publishes, everything arrives, clean stop: some matches."""
    svc = Service(tmp_path, url)
    svc.start()
    subprocess.run(gen_args(events, url), check=True)
    svc.wait_for(events)
    svc.stop()
    assert svc.output()


def test_end_to_end_matches_equal_the_reference(mosquitto, tmp_path):
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/e2e"
    want, n_events = expected_matches(20_000, tmp_path)
    svc = Service(tmp_path, url)
    svc.start()
    subprocess.run(gen_args(20_000, url), check=True)
    svc.wait_for(n_events)
    svc.finish()
    assert svc.output() == want and len(want) > 50
    # response times measured per query, live (arrival to output); what the end of the
    # stream released has no arrival of its batch and is not counted
    stats = json.loads((tmp_path / "stats.json").read_text())
    names = {json.loads(m)["query"] for m in want}
    for name, r in stats["response"].items():
        assert (r["matches"] > 0) == (name in names), (name, r)
        if r["matches"]:
            assert 0 < r["mean_ms"] <= r["max_ms"]
    assert sum(r["matches"] for r in stats["response"].values()) > len(want) // 2
    assert sum(r["matches"] + r["unmeasured"] for r in stats["response"].values()) <= \
        stats["matches_out"]


def test_sigkill_mid_stream_loses_and_repeats_nothing(mosquitto, tmp_path):
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/kill"
    extra = ("--malformed", "0.002", "--duplicates", "0.01")
    want, n_events = expected_matches(40_000, tmp_path, extra)
    svc = Service(tmp_path, url)
    svc.start()
    pub = subprocess.Popen(gen_args(40_000, url, extra + ("--rate", "20000")))
    svc.wait_for(8_000)
    svc.kill_and_restart()
    assert svc.after_the_publisher(pub, n_events) == want
    dead = [json.loads(x) for x in (tmp_path / "out.state" / "dead-letter.jsonl").read_text()
            .splitlines()]
    assert dead and all(d["reason"] and d["payload"] for d in dead)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["malformed"] == sum(map(rejected_events, dead)) and stats["duplicates"] > 0


def test_sigterm_restarts_keep_held_matches_for_the_next_run(mosquitto, tmp_path):
    """Three SIGTERM restarts mid-stream: exactly the reference's matches. A stop is a
    pause: the matches held for a trailing NOT wait in the checkpoint, and only the
    end of the stream releases them (it once released them at every SIGTERM)."""
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/term"
    queries = tmp_path / "held.cep"
    queries.write_text(QUERIES.read_text() + """;
-- held until 20 s after the door: true matches come out at the end of the stream
QUERY unattended
PATTERN SEQ(Door d, Motion m, NOT Door c)
WHERE [room] AND d.open = true AND m.active = true
WITHIN 20 s;

-- humidity follows a temperature reading in its room within 5 s: a match held at a
-- stop is almost always one that a later event takes back
QUERY dry
PATTERN SEQ(Temperature t, NOT Humidity h)
WHERE [room]
WITHIN 5 s
""")
    want, n_events = expected_matches(40_000, tmp_path, queries=queries)
    assert any('"unattended"' in m for m in want)
    svc = Service(tmp_path, url, queries)
    svc.start()
    pub = subprocess.Popen(gen_args(40_000, url, ("--rate", "5000"), queries))
    for seen in (6_000, 14_000, 22_000):
        svc.wait_for(seen)
        svc.stop()
        svc.start()
    assert svc.after_the_publisher(pub, n_events) == want


def test_after_match_policies_are_exactly_once_across_kills_and_pauses(mosquitto, tmp_path):
    """Queries with AFTER MATCH (spec section 6), one a Kleene item under any-match whose
    partial matches the policy prunes, one held for a trailing NOT: a SIGKILL and a
    SIGTERM pause mid-stream (matches waiting for their decision, and the accepted
    bounds, in the checkpoint), then the end of the stream: exactly the reference's
    accepted matches, each once."""
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/policy"
    queries = tmp_path / "policies.cep"
    queries.write_text(QUERIES.read_text() + """ AFTER MATCH SKIP PAST LAST EVENT;

QUERY warming
PATTERN SEQ(Temperature+ t[], Smoke s)
WHERE [room] AND t[i].value > t[i-1].value AND count(t) >= 2
WITHIN 3 s AFTER MATCH SKIP PAST LAST EVENT;

QUERY entered
PATTERN SEQ(Door d, Motion m, NOT Door c)
WHERE [room] AND d.open = true AND m.active = true
WITHIN 20 s AFTER MATCH SKIP TO NEXT EVENT;

-- overlapping pairs everywhere: a lost bound or waiting match shows at once
QUERY readings
PATTERN SEQ(Temperature a, Temperature b)
WHERE [room]
WITHIN 5 s AFTER MATCH SKIP PAST LAST EVENT
""")
    want, n_events = expected_matches(20_000, tmp_path, queries=queries, plant=QUERIES)
    names = {json.loads(m)["query"] for m in want}
    assert {"stuffy", "warming", "entered", "readings"} <= names, names
    svc = Service(tmp_path, url, queries)
    svc.start()
    pub = subprocess.Popen(gen_args(20_000, url, ("--rate", "10000")))
    svc.wait_for(6_000)
    svc.kill_and_restart()
    svc.wait_for(12_000)
    svc.stop()
    svc.start()
    assert svc.after_the_publisher(pub, n_events) == want


def test_out_of_order_within_lateness_and_late_events(mosquitto, tmp_path):
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/ooo"
    # delays up to 300 ms for 20% of events, 2% beyond 300 ms (up to 5 s)
    extra = ("--out-of-order", "0.2", "--slack", "300", "--late", "0.02", "--late-max", "5000")
    svc = Service(tmp_path, url)
    svc.args += ["--lateness", "400"]
    svc.start()
    subprocess.run(gen_args(20_000, url, extra), check=True)
    svc.wait_for(20_000 - 50)
    time.sleep(0.5)
    svc.finish()
    late = [json.loads(x)["event"] for x in
            (tmp_path / "out.state" / "late.jsonl").read_text().splitlines()]
    assert late, "events delayed by up to 5 s must exceed a 400 ms lateness"
    # the service's matches are the reference's over the events it did not divert
    stream = tmp_path / "s.msgpack"
    subprocess.run(gen_args(20_000, str(stream), extra), check=True)
    late_ids = {e["id"] for e in late}
    events = [event_from_mapping(e) for p in msgpack.Unpacker(open(stream, "rb"), raw=False)
              for e in p["events"] if e["id"] not in late_ids]
    want = {json.dumps(m.to_json_obj())
            for m in ReferenceMatcher(parse_file(QUERIES).queries).run(events)}
    assert svc.output() == want


def test_an_integer_past_64_bits_is_a_dead_letter_not_a_crash_loop(mosquitto, tmp_path):
    """Issue 49 item 11: one device message with an integer past 64 bits made every
    checkpoint of a --returns service raise OverflowError (msgpack), at every start.
    Now the event is malformed (dead letter, with the reason) and the service checkpoints,
    stops and starts again, matching the events around it."""
    host, port = mosquitto
    topic = "dqcep/big"
    svc = Service(tmp_path, f"mqtt://{host}:{port}/{topic}",
                  queries=ROOT / "examples" / "fire.cep")
    svc.args.append("--returns")
    svc.start()
    events = [{"id": 1, "type": "Temperature", "ts": 1000, "room": 1, "value": 60},
              {"id": 2, "type": "Temperature", "ts": 1500, "room": 1, "value": 10 ** 30},
              {"id": 3, "type": "Smoke", "ts": 2000, "room": 1, "density": 9,
               "serial": 2 ** 64 - 1},
              {"id": 4, "type": "Alarm", "ts": 2500, "room": 1}]
    publish_all(host, port, topic, [json.dumps(e).encode() for e in events], "big-ints")
    svc.wait_for(3)
    for _ in range(3):  # a checkpoint was written each time: the restarts all start
        svc.stop()
        svc.start()
    svc.finish()
    dead = [json.loads(x) for x in (tmp_path / "out.state" / "dead-letter.jsonl")
            .read_text().splitlines()]
    assert len(dead) == 1 and "does not fit in 64 bits" in dead[0]["reason"], dead
    fire = [m for m in map(json.loads, svc.output()) if m["query"] == "fire"]
    assert [(m["events"], m["return"]) for m in fire] == \
        [({"t": 1, "s": 3, "a": 4}, {"t": 1, "s.density": 9})], fire


def test_hostile_payloads_never_stop_the_service(mosquitto, tmp_path):
    import random

    host, port = mosquitto
    topic = "dqcep/fuzz"
    svc = Service(tmp_path, f"mqtt://{host}:{port}/{topic}")
    svc.start()
    rnd = random.Random(3)
    payloads = [bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 64)))
                for _ in range(200)]
    payloads += [msgpack.packb({"events": [{"id": "x", "type": 5, "ts": None}] * 100}),
                 msgpack.packb({"events": []}), b"\x91" * 50_000 + b"\xc0",
                 msgpack.packb({"id": 1, "type": "Door", "ts": 5, "open": {"a": [1, [2]]}}),
                 msgpack.packb({"events": [{"id": i, "type": "Door", "ts": i, "open": True}
                                           for i in range(1, 20_001)]})]
    publish_all(host, port, topic, payloads, "fuzzer")
    svc.wait_for(20_000)  # the big valid batch at the end got through
    svc.stop()
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["payloads"] == len(payloads)
    dead = [json.loads(x) for x in
            (tmp_path / "out.state" / "dead-letter.jsonl").read_text().splitlines()]
    assert sum(map(rejected_events, dead)) == stats["malformed"] >= 200 + 100
    # one line per bad payload (the batch of 100 bad events too); the empty batch and
    # the big valid one have none
    assert len(dead) == len(payloads) - 2


class Broker:
    """A Mosquitto with persistence on a fixed port, so it can be stopped and started again."""

    def __init__(self, tmp_path):
        self.port = free_port()
        self.conf = tmp_path / "broker.conf"
        (tmp_path / "broker-db").mkdir()
        import getpass  # as root Mosquitto would drop to its own user, who cannot write
        self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
                             f"persistence true\npersistence_location {tmp_path / 'broker-db'}/\n"
                             f"autosave_interval 1\nmax_queued_messages 0\n"
                             f"user {getpass.getuser()}\n")  # the database, losing the queue
        self.proc = None

    def start(self):
        self.proc = start_mosquitto(self.conf, self.port)

    def stop(self):
        stop_mosquitto(self.proc)


def test_broker_restart_mid_stream_loses_nothing(tmp_path):
    broker = Broker(tmp_path)
    broker.start()
    url = f"mqtt://127.0.0.1:{broker.port}/dqcep/restart"
    want, n_events = expected_matches(30_000, tmp_path)
    svc = Service(tmp_path, url)
    try:
        svc.start()
        pub = subprocess.Popen(gen_args(30_000, url, ("--rate", "10000")))
        svc.wait_for(6_000)
        broker.stop()           # the broker goes away mid-stream ...
        time.sleep(1.0)
        broker.start()          # ... and comes back: both clients reconnect
        assert pub.wait(90) == 0
        svc.wait_for(n_events, timeout=90)
        svc.finish()
        assert svc.output() == want
    finally:
        if svc.proc and svc.proc.poll() is None:
            svc.proc.kill()
        broker.stop()


def test_demo_over_mqtt(mosquitto):
    host, port = mosquitto
    r = subprocess.run([sys.executable, "-m", "dqcep", "demo", "--mqtt", "--broker",
                        f"{host}:{port}", "--events", "20000", "--show", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"broker {host}:{port}" in r.stdout
    assert "20,000 of 20,000 events arrived over MQTT" in r.stdout
    found, planted = r.stdout.split("planted occurrences found: ")[1].split()[0:3:2]
    assert found == planted
    r = subprocess.run([sys.executable, "-m", "dqcep", "demo", "--mqtt", "--broker",
                        f"127.0.0.1:{free_port()}"], capture_output=True, text=True)
    assert r.returncode == 2 and "cannot reach the MQTT broker" in r.stderr


def test_username_and_password_from_the_environment(tmp_path):
    pw = tmp_path / "passwords"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(pw), "sensor", "s3cret"], check=True)
    port = free_port()
    conf = tmp_path / "auth.conf"
    import getpass  # as root Mosquitto would drop to its own user, who cannot read tmp_path
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous false\npassword_file {pw}\n"
                    f"user {getpass.getuser()}\n")
    broker = start_mosquitto(conf, port)
    try:
        url = f"mqtt://sensor@127.0.0.1:{port}/dqcep/auth"
        env = {**os.environ, "DQCEP_MQTT_PASSWORD": "wrong"}
        bad = subprocess.run(["timeout", "30", *Service(tmp_path, url).args], env=env,
                             capture_output=True, text=True)
        assert bad.returncode == 2 and "refused the connection" in bad.stderr
        os.environ["DQCEP_MQTT_PASSWORD"] = "s3cret"
        run_small_stream(tmp_path, url)
    finally:
        os.environ.pop("DQCEP_MQTT_PASSWORD", None)
        stop_mosquitto(broker)


def test_tls_broker(tmp_path):
    import getpass

    def sh(*args):
        subprocess.run(args, check=True, capture_output=True, cwd=tmp_path)

    sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
       "-out", "ca.crt", "-days", "1", "-subj", "/CN=dqcep-test-ca")
    sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
       "server.csr", "-subj", "/CN=127.0.0.1")
    (tmp_path / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    sh("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
       "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "san.ext")
    port = free_port()
    conf = tmp_path / "tls.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                    f"cafile {tmp_path / 'ca.crt'}\ncertfile {tmp_path / 'server.crt'}\n"
                    f"keyfile {tmp_path / 'server.key'}\nuser {getpass.getuser()}\n")
    broker = start_mosquitto(conf, port)
    os.environ["DQCEP_MQTT_CA"] = str(tmp_path / "ca.crt")
    try:
        url = f"mqtts://127.0.0.1:{port}/dqcep/tls"
        run_small_stream(tmp_path, url)
    finally:
        os.environ.pop("DQCEP_MQTT_CA", None)
        stop_mosquitto(broker)


def test_matches_published_to_mqtt(mosquitto, tmp_path):
    host, port = mosquitto
    examples = ROOT / "examples"
    want = (examples / "fire-expected.jsonl").read_text().splitlines()
    with subscribed(host, port, "dqcep/matches", "match-reader") as got:
        for fmt, decode in (("json", json.loads), ("msgpack", msgpack.unpackb)):
            got.clear()
            r = subprocess.run([sys.executable, "-m", "dqcep", "run", examples / "fire.cep",
                                "--input", examples / "fire-events.jsonl", "--output",
                                f"mqtt://{host}:{port}/dqcep/matches", "--output-format", fmt],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            deadline = time.monotonic() + 10
            while len(got) < len(want) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert sorted(json.dumps(decode(p)) for p in got) == sorted(
                json.dumps(json.loads(x)) for x in want)


def test_two_services_with_their_own_client_ids_each_get_the_whole_stream(mosquitto, tmp_path):
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/two"
    want, n_events = expected_matches(5_000, tmp_path)
    services = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        svc = Service(tmp_path / name, url)
        svc.args += ["--client-id", f"dqcep-{name}"]
        svc.start()
        services.append(svc)
    subprocess.run(gen_args(5_000, url), check=True)
    for svc in services:
        svc.wait_for(n_events)
        svc.finish()
        assert svc.output() == want


def test_wildcard_topic_filters_receive_what_is_published_below_them(mosquitto, tmp_path):
    host, port = mosquitto
    svc = Service(tmp_path, f"mqtt://{host}:{port}/dqcep/wild/#")
    svc.args += ["--input", f"mqtt://{host}:{port}/dqcep/plus/+/t"]
    svc.start()
    subprocess.run(gen_args(2_000, f"mqtt://{host}:{port}/dqcep/wild/room1"), check=True)
    subprocess.run(gen_args(1_000, f"mqtt://{host}:{port}/dqcep/plus/room2/t",
                            ("--seed", "6")), check=True)
    svc.wait_for(10 + 5, counter="payloads")  # batches of 200 events
    svc.stop()
    # a filter is no place to publish to: refused before anything is sent
    r = subprocess.run(gen_args(10, f"mqtt://{host}:{port}/dqcep/wild/#"),
                       capture_output=True, text=True)
    assert r.returncode == 2 and "cannot hold the wildcards" in r.stderr


def test_an_oversized_payload_is_refused_and_ingest_goes_on(mosquitto, tmp_path):
    """65 MiB (over the journal's record limit) once killed the MQTT thread: lag 0,
    nothing taken in, forever. Now it is dead-lettered by size and topic."""
    host, port = mosquitto
    topic = "dqcep/huge"
    svc = Service(tmp_path, f"mqtt://{host}:{port}/{topic}")
    svc.start()
    good = msgpack.packb({"events": [{"id": i, "type": "Door", "ts": i, "room": "r",
                                      "open": True} for i in range(1, 1001)]})
    publish_all(host, port, topic, [good[:100], b"\x00" * (65 * 1024 * 1024), good])
    svc.wait_for(1000)
    svc.stop()
    dead = [json.loads(x) for x in
            (tmp_path / "out.state" / "dead-letter.jsonl").read_text().splitlines()]
    assert [d["offset"] for d in dead] == [0, 1]
    assert dead[1]["size"] == 65 * 1024 * 1024 and dead[1]["topic"] == topic
    assert "payload" not in dead[1] and "refused at ingest" in dead[1]["reason"]
    assert (tmp_path / "out.state" / "dead-letter.jsonl").stat().st_size < 1000


def test_a_json_payload_that_is_no_unicode_does_not_crash_loop(mosquitto, tmp_path):
    host, port = mosquitto
    topic = "dqcep/json"
    svc = Service(tmp_path, f"mqtt://{host}:{port}/{topic}")
    svc.args += ["--format", "json"]
    svc.start()
    bad = b'{"id": 2, "type": "Temperature", "ts": 1, "room": "\\ud800"}'
    late = b'{"id": 3, "type": "Temperature", "ts": 0, "room": "\\udfff", "value": 1}'
    good = b'{"id": 1, "type": "Temperature", "ts": 10, "room": "r", "value": 1}'
    publish_all(host, port, topic, [bad, good, late, b'{"id": 9, "type": "T", "ts": 11}'])
    svc.wait_for(2)
    svc.stop()
    svc.start()  # the journal holds the bad payloads: a restart does not die on them
    svc.stop()
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["malformed"] == 2 and stats["events_in"] == 2 and stats["late"] == 0


def test_a_dead_ingest_thread_ends_the_service_loudly(mosquitto, tmp_path):
    import threading

    from dqcep.service import StreamingService
    from tests.support.journal_service import config
    host, port = mosquitto
    cfg = config(tmp_path)
    cfg.inputs = [f"mqtt://{host}:{port}/dqcep/dies"]
    svc = StreamingService(cfg)

    def broken_append(records, count):  # what the MQTT source's reader appends with
        raise MemoryError("simulated")
    svc.journal.append_framed = broken_append
    stop = threading.Event()
    result = []
    worker = threading.Thread(target=lambda: result.append(svc.run(stop)))
    worker.start()
    time.sleep(1.0)
    publish_all(host, port, "dqcep/dies", [b"x"])
    worker.join(20)
    assert not worker.is_alive() and result == [1]


@pytest.mark.parametrize("full", ["journal", "output and checkpoint"])
def test_a_full_disk_stalls_loudly_and_recovers_when_space_comes_back(mosquitto, tmp_path,
                                                                      full):
    """A file-size limit on the service stands in for a full disk (EFBIG where ENOSPC
    would be): the service says why, acknowledges nothing it could not journal, and
    once the limit is lifted catches up to exactly the reference's matches. It once
    stayed up silently, taking nothing in, and exited 0."""
    import resource
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/full-{full[:3]}"
    want, n_events = expected_matches(20_000, tmp_path, ("--batch-size", "50"))
    svc = Service(tmp_path, url)
    if full == "journal":
        limit = 100_000            # the journal's one segment outgrows it
    else:
        limit = 60_000             # small segments; the matches and checkpoints do not fit
        svc.args += ["--journal-segment", "16K"]

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    svc.start(preexec_fn=small_files)
    subprocess.run(gen_args(20_000, url, ("--batch-size", "50", "--rate", "20000")),
                   check=True, timeout=120)
    for _ in range(200):  # stats lines every 0.2 s in between
        message = svc.next_line()
        if "cannot write" in message or not message:
            break
    assert ("cannot write the journal" if full == "journal" else "cannot write") in message
    assert "File too large" in message
    assert svc.proc.poll() is None
    time.sleep(1.0)
    resource.prlimit(svc.proc.pid, resource.RLIMIT_FSIZE,
                     (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    svc.wait_for(n_events, timeout=90)
    svc.finish()
    assert svc.output() == want


def test_the_service_starts_with_what_a_person_would_type(mosquitto, tmp_path):
    """`dqcep run q.cep --input mqtt://host/topic/# --output matches.jsonl`: the journal,
    checkpoint, dead letters and late events go to one state directory beside the
    output (issue 15, item 3; --journal and --checkpoint were required)."""
    host, port = mosquitto
    out = tmp_path / "matches.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "dqcep", "run", str(QUERIES), "--input",
                             f"mqtt://{host}:{port}/dqcep/typed/#", "--output", str(out),
                             "--stats-file", str(tmp_path / "stats.json"), "--stats-every",
                             "0.2", "--until-idle", "2"], stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    assert "listening on" in line and f"state in {tmp_path / 'matches.state'}" in line, line
    publish_all(host, port, "dqcep/typed/r1", [msgpack.packb(
        {"events": [{"id": 1, "type": "Door", "ts": 1, "room": "r", "open": True},
                    {"id": 2, "type": "Motion", "ts": 2, "room": "r", "active": True}]}), b"x"])
    assert proc.wait(30) == 0, proc.stderr.read()
    state = tmp_path / "matches.state"
    assert (state / "checkpoint.bin").exists() and (state / "journal").is_dir()
    assert len((state / "dead-letter.jsonl").read_text().splitlines()) == 1
    assert json.loads(out.read_text())["query"] == "intrusion"


def test_an_unreachable_broker_or_a_stateless_mqtt_output_is_one_line(tmp_path):
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "dqcep", "run", str(QUERIES), "--input",
                        f"mqtt://127.0.0.1:{port}/t", "--output", str(tmp_path / "m.jsonl")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr == f"cannot connect to the MQTT broker at 127.0.0.1:{port}: " \
                       "Connection refused\n"
    r = subprocess.run([sys.executable, "-m", "dqcep", "run", str(QUERIES), "--input",
                        f"mqtt://127.0.0.1:{port}/t", "--output", f"mqtt://127.0.0.1:{port}/o"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--state DIR" in r.stderr



def test_kleene_items_and_strategies_survive_sigkill(mosquitto, tmp_path):
    """Spec section 5 through the service: lists and runs open in the checkpoint when
    the service is killed, restored on restart; exactly the reference's matches."""
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/section5"
    queries = tmp_path / "section5.cep"
    queries.write_text(SECTION5)
    stream = tmp_path / "stream.msgpack"
    subprocess.run(gen_args(12_000, str(stream)), check=True)
    events = [event_from_mapping(e) for p in msgpack.Unpacker(open(stream, "rb"), raw=False)
              for e in p["events"]]
    want = {json.dumps(m.to_json_obj())
            for m in ReferenceMatcher(parse_file(queries).queries).run(events)}
    svc = Service(tmp_path, url, queries)
    svc.start()
    pub = subprocess.Popen(gen_args(12_000, url, ("--rate", "6000")))
    svc.wait_for(3_000)
    svc.kill_and_restart()
    assert pub.wait(60) == 0
    svc.wait_for(len(events))
    svc.finish()
    got = svc.output()
    assert got == want
    assert {json.loads(x)["query"] for x in want} >= {"rising", "forced_door", "by_room"}


@pytest.mark.parametrize("fmt", ["msgpack", "json"])
def test_events_a_schema_refuses_are_dead_letters(mosquitto, tmp_path, fmt):
    """EVENT Door(open BOOL, room STRING): a door whose open is no boolean goes to the
    dead-letter file with the payload's offset and the reason, counted malformed; the
    matches are the reference's over the rest (the msgpack fast decoder and the json
    validator path alike)."""
    host, port = mosquitto
    topic = f"dqcep/declared/{fmt}"
    queries = tmp_path / "q.cep"
    queries.write_text("EVENT Door(open BOOL, room STRING);\n"
                       "QUERY opened PATTERN SEQ(Door d, Motion m) WHERE [room] AND "
                       "d.open = true WITHIN 10 s")
    svc = Service(tmp_path, f"mqtt://{host}:{port}/{topic}", queries)
    svc.args += ["--format", fmt]
    svc.start()
    events = []
    for i in range(1, 301):
        kind = i % 3
        e = {"id": i, "type": "Door" if kind else "Motion", "ts": 10 * i, "room": f"r{i % 4}"}
        if kind:
            e["open"] = True if i % 10 else "yes"  # every tenth door: no boolean
        events.append(e)
    pack = msgpack.packb if fmt == "msgpack" else (lambda o: json.dumps(o).encode())
    publish_all(host, port, topic, [pack({"events": events[:150]}),
                                    pack({"events": events[150:]})])
    svc.wait_for(300)
    svc.stop()
    refused = [e for e in events if e.get("open") == "yes"]
    dead = [json.loads(x) for x in
            (tmp_path / "out.state" / "dead-letter.jsonl").read_text().splitlines()]
    assert sorted(d["event"] for d in dead) == [e["id"] for e in refused] and refused
    assert all(d["reason"] == "Door.open is declared BOOL, got a string" for d in dead)
    assert all(d["offset"] == (0 if d["event"] <= 150 else 1) for d in dead)
    assert json.loads((tmp_path / "stats.json").read_text())["malformed"] == len(refused)
    parsed = parse_file(queries)
    fitting = [event_from_mapping(e) for e in events if e not in refused]
    want = {json.dumps(m.to_json_obj())
            for m in ReferenceMatcher(parsed.queries, parsed.schemas).run(fitting)}
    assert svc.output() == want and want


@pytest.mark.parametrize("workers", [None, 2], ids=["service", "workers"])
def test_a_held_alert_comes_out_with_the_message_that_makes_it_final(mosquitto, tmp_path,
                                                                     workers):
    """Spec section 7, output by finality, through the broker: door-3 opens at 1 s
    (lateness 1 s, its alert final once G - L > 9 s); door-9 opens at 16 s and stays
    in the reorder buffer, yet makes door-3's alert final: it is written with that
    message, no third one needed (issue 52 found it waiting for one)."""
    from tests.support.service import Workers
    host, port = mosquitto
    queries = tmp_path / "doors.cep"
    queries.write_text("QUERY left_open PATTERN SEQ(Door o, NOT Door c) WHERE o.open = true "
                       "AND c.open = false AND c.device = o.device WITHIN 8 s")
    svc = Workers(tmp_path, f"mqtt://{host}:{port}/doors", "--lateness", "1000",
                  "--client-id", f"doors-{workers}",
                  *(["--workers", str(workers)] if workers else []), queries=queries)
    out = tmp_path / ("out.left_open.jsonl" if workers else "out.jsonl")
    svc.start()
    try:
        for i, ts, device in ((1, 1000, "door-3"), (2, 16000, "door-9")):
            publish_all(host, port, "doors", [json.dumps(
                {"id": i, "type": "Door", "ts": ts, "device": device, "open": True})])
            svc.wait_for(i)
        deadline = time.monotonic() + 30
        while not (out.exists() and out.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert out.exists() and [json.loads(line) for line in out.read_text().splitlines()] \
            == [{"query": "left_open", "detected_at": 9000, "events": {"o": 1}}], svc.stderr()
    finally:
        svc.proc.terminate()
        svc.proc.wait(30)
