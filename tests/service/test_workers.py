"""The streaming service as worker processes (dqcep.service.coordinator and .worker),
against a real Mosquitto:
each query a journal consumer of its own, moved between workers with its checkpoint;
scaled up and down live; every run compared with the reference matcher."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest

from dqcep.service.scaling.model import Calibration, QueryCost
from dqcep.core.events import event_from_mapping
from dqcep.io.mqtt import MqttPublisher, MqttUrl
from dqcep.lang import parse_file
from dqcep.baseline.reference import ReferenceMatcher
from tests.support.service import Workers
from tests.support.paths import ROOT

# Each test here starts processes or a broker: the quick run leaves them out.
pytestmark = pytest.mark.integration

QUERIES = ROOT / "dqcep" / "data" / "iot.cep"
NAMES = [q.name for q in parse_file(str(QUERIES)).queries]


def stream(tmp_path, events: int, queries=QUERIES) -> tuple[list[bytes], set[str]]:
    """Payloads of 200 generated IoT events with planted matches (of iot.cep), and the
    reference's matches of them (of ``queries``)."""
    path = tmp_path / "stream.msgpack"
    subprocess.run([sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n",
                    str(events), "--seed", "7", "--batch-size", "200", "--plant", str(QUERIES),
                    "--plant-every", "130000", "--quiet", "--truth", str(tmp_path / "t"),
                    "-o", str(path)], check=True)
    objs = list(msgpack.Unpacker(open(path, "rb"), raw=False))
    events_ = [event_from_mapping(e) for o in objs for e in o["events"]]
    want = {json.dumps(m.to_json_obj()) for m in
            ReferenceMatcher(parse_file(str(queries)).queries).run(events_)}
    return [msgpack.packb(o) for o in objs], want


def publish(url: str, payloads: list[bytes], per_second: float) -> None:
    pub = MqttPublisher(MqttUrl.parse(url), client_id=f"test-pub-{time.monotonic_ns()}")
    start = time.monotonic()
    for i, p in enumerate(payloads):
        wait = start + i / per_second - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        pub.publish(p)
    pub.close()


POLICIES = QUERIES.read_text() + """ AFTER MATCH SKIP PAST LAST EVENT;

QUERY readings
PATTERN SEQ(Temperature a, Temperature b)
WHERE [room]
WITHIN 5 s AFTER MATCH SKIP PAST LAST EVENT
"""


@pytest.mark.parametrize("policies", [False, True], ids=["queries", "after-match policies"])
def test_two_workers_match_the_reference_across_a_sigkill(mosquitto, tmp_path, policies):
    """Each query on a worker, its own output file; the coordinator SIGKILLed mid-stream
    (its workers see it gone and stop), restarted: every query goes on from its own
    checkpoint, nothing lost or written twice. With after-match policies (spec 6), the
    matches waiting for their decision and the last accepted ones go with each query's
    checkpoint."""
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/workers/kill"
    queries = QUERIES
    if policies:
        queries = tmp_path / "policies.cep"
        queries.write_text(POLICIES)
    payloads, want = stream(tmp_path, 30_000, queries)
    svc = Workers(tmp_path, url, "--workers", "2", "--client-id", "workers-kill",
                  queries=queries)
    svc.start()
    assert "2 worker(s) (start)" in svc.stderr()
    publish(url, payloads[:80], 400)
    svc.wait_for(80 * 200)
    svc.proc.kill()
    svc.proc.wait()
    time.sleep(0.5)  # the workers notice within one wait
    svc.log.write("--- restart ---\n")
    svc.log.flush()
    publish(url, payloads[80:], 400)  # the broker keeps them for the session
    svc.start()
    if policies:  # a pause mid-catch-up: each query's checkpoint, restored on the start
        svc.wait_for(22_000)
        svc.proc.send_signal(signal.SIGTERM)
        assert svc.proc.wait(60) == 0, svc.stderr()
        svc.log.write("--- restart ---\n")
        svc.log.flush()
        svc.start()
    svc.wait_for(30_000)
    svc.finish()
    assert svc.output() == want and len(want) > 20
    assert svc.stats()["workers"] and all(
        svc.stats()["queries"][q]["events_in"] == 30_000 for q in svc.names)
    # the orphaned workers of the killed coordinator left quietly (they printed
    # EOFError tracebacks)
    assert "Traceback" not in svc.stderr() and "EOFError" not in svc.stderr(), svc.stderr()


def worker_pids(coordinator: int) -> list[int]:
    """The worker processes of a coordinator (not multiprocessing's resource tracker)."""
    pids = [int(p) for p in subprocess.run(["pgrep", "-P", str(coordinator)],
                                           capture_output=True, text=True).stdout.split()]
    return [p for p in pids if is_worker(p)]


def is_worker(pid: int) -> bool:
    """False for multiprocessing's resource tracker and for a process that has just
    ended (a worker killed between pgrep and the read: FileNotFoundError failed a
    .ci/run)."""
    try:
        return b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_killed_worker_is_restarted_from_its_checkpoints(mosquitto, tmp_path):
    """SIGKILL of a worker mid-stream: the coordinator notices within a second, starts
    it again and it hosts its queries from their checkpoints; the stream goes on to
    exactly the reference's matches, each once. Then the other worker is killed, and a
    SIGTERM soon after still stops the service (it used to hang for good: waking the
    workers through a multiprocessing.Event blocked once a waiter had died)."""
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/workers/killone"
    payloads, want = stream(tmp_path, 30_000)
    svc = Workers(tmp_path, url, "--workers", "2", "--client-id", "workers-killone")
    svc.start()
    first = worker_pids(svc.proc.pid)
    assert len(first) == 2, first
    publish(url, payloads[:60], 400)
    svc.wait_for(60 * 200)
    os.kill(first[0], signal.SIGKILL)
    publish(url, payloads[60:], 400)
    deadline = time.monotonic() + 10
    while "restarting it from the checkpoints" not in svc.stderr():
        assert svc.proc.poll() is None and time.monotonic() < deadline, svc.stderr()
        time.sleep(0.05)
    assert "killed by signal 9" in svc.stderr()
    svc.wait_for(30_000)
    second = worker_pids(svc.proc.pid)
    assert len(second) == 2 and first[1] in second and first[0] not in second, second
    os.kill(first[1], signal.SIGKILL)
    time.sleep(0.3)
    svc.proc.send_signal(signal.SIGTERM)
    assert svc.proc.wait(60) == 0, svc.stderr()
    assert "Traceback" not in svc.stderr(), svc.stderr()
    svc.log.write("--- restart ---\n")
    svc.log.flush()
    svc.start()   # the end of stream releases what a trailing NOT held at the pause
    svc.finish()
    assert svc.output() == want and len(want) > 20


def test_a_worker_that_keeps_dying_ends_the_service_with_the_reason(mosquitto, tmp_path):
    """A worker killed again and again is not restarted for ever: after RESTARTS
    deaths within RESTART_WINDOW s the coordinator exits 1 and says why."""
    from dqcep.service.coordinator import RESTARTS
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/workers/crashloop"
    svc = Workers(tmp_path, url, "--workers", "1", "--client-id", "workers-crashloop")
    svc.start()
    for death in range(RESTARTS + 1):
        deadline = time.monotonic() + 30
        while not worker_pids(svc.proc.pid) or svc.stderr().count(
                "restarting it from") < death:
            assert time.monotonic() < deadline and svc.proc.poll() is None, svc.stderr()
            time.sleep(0.05)
        time.sleep(0.3)  # the restarted worker hosts its queries
        for pid in worker_pids(svc.proc.pid):
            os.kill(pid, signal.SIGKILL)
    assert svc.proc.wait(30) == 1, svc.stderr()
    assert f"died (killed by signal 9) {RESTARTS + 1} times within" in svc.stderr()


def test_scale_up_and_down_live_moves_queries_and_loses_nothing(mosquitto, tmp_path):
    """--target with a calibration where a query takes 2.2 ms per payload: at 20
    payloads/s one worker holds the three queries (load 0.13), at 160/s a worker holds
    two at most (load 0.70; three 1.06): the coordinator starts a second worker and moves a query
    there with its checkpoint; back at 20/s, every query far below its target, it moves
    it back and stops the worker. The matches are the reference's, each once. A
    worker steps its consumers in the model's order: the tightest target (stuffy's)
    first."""
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/workers/scale"
    cost = {q: QueryCost(q, 0.0022, 1e-5) for q in NAMES}
    (tmp_path / "cal.json").write_text(json.dumps(Calibration(
        200, 100, cost, cost, 0.003, QueryCost("overhead", 0, 0), 0.0,
        QueryCost("checkpoint", 0, 0), 1.0, 0.0).to_json()))
    payloads, want = stream(tmp_path, 116_000)
    svc = Workers(tmp_path, url, "--target", "*=1000", "--target", "stuffy=900",
                  "--calibration", str(tmp_path / "cal.json"), "--replan-every", "1",
                  "--client-id", "workers-scale")
    svc.start()
    publish(url, payloads[:40], 20)
    publish(url, payloads[40:520], 160)
    publish(url, payloads[520:], 20)
    deadline = time.monotonic() + 30
    while len(svc.stats().get("workers", [])) != 1 or len(svc.stats()["plans"]) < 3:
        assert time.monotonic() < deadline, svc.stats().get("plans")
        time.sleep(0.2)
    svc.wait_for(116_000)
    svc.finish()
    plans = svc.stats()["plans"]
    counts = [len(p["workers"]) for p in plans]
    assert counts[0] == 1 and 2 in counts and counts[-1] == 1, plans
    assert plans[0]["workers"] == plans[-1]["workers"] == [
        ["stuffy", "intrusion", "overheating"]], plans
    assert all(w.index("stuffy") == 0 for p in plans for w in p["workers"] if "stuffy" in w)
    # moved with its state: taken over at the offset it was let go at, mid-stream
    assert any(p["moved"] for p in plans[1:]) and all(
        offset > 0 for p in plans[1:] for offset in p["moved"].values()), plans
    assert svc.output() == want and len(want) > 20


def test_a_worker_retries_a_failed_write_and_loses_nothing(mosquitto, tmp_path):
    """A file-size limit on the worker processes stands in for a full disk: the
    queries' checkpoints (the recent ids alone take 8 bytes an event) cannot be
    written. Each worker says why, goes back to its consumers' last checkpoints and
    retries, as the single service does, and the stats say FAILING; once the limit is
    lifted every query catches up to exactly the reference's matches. A worker used to
    stop the service on the first failed write."""
    import resource
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/workers/full"
    payloads, want = stream(tmp_path, 30_000)
    svc = Workers(tmp_path, url, "--workers", "2", "--client-id", "workers-full")
    svc.start()

    def limit(pids, size):
        for pid in pids:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
    workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(svc.proc.pid)],
                                              capture_output=True, text=True).stdout.split()]
    assert len(workers) >= 2, workers  # the workers (and multiprocessing's tracker)
    limit(workers, 100_000)
    publish(url, payloads, 200)
    deadline = time.monotonic() + 30
    while "cannot write" not in svc.stderr() or not svc.stats().get("error"):
        assert svc.proc.poll() is None and time.monotonic() < deadline, svc.stderr()
        time.sleep(0.1)
    assert "File too large" in svc.stderr() and "File too large" in svc.stats()["error"]
    time.sleep(1.5)  # a few retries
    assert svc.proc.poll() is None, svc.stderr()
    limit(workers, resource.RLIM_INFINITY)
    svc.wait_for(30_000, timeout=90)
    svc.finish()
    assert svc.output() == want and len(want) > 20
    assert svc.stats()["error"] is None


@pytest.mark.parametrize("extra, message", [
    (("--workers", "0"), "--workers must be >= 1"),
    (("--target", "*=5"), "--target needs --calibration FILE"),
    (("--workers", "2", "--calibration", "c.json"), "--calibration is what --target places by"),
    (("--workers", "2", "--queries", "stuffy"), "--queries runs one service"),
    (("--workers", "2", "--output", "sqlite:///m.db"), "a database output takes one service"),
])
def test_worker_options_are_checked(tmp_path, extra, message):
    r = subprocess.run([sys.executable, "-m", "dqcep", "run", str(QUERIES), "--input",
                        "mqtt://127.0.0.1:1/x", "--state", str(tmp_path / "s"), "-o",
                        str(tmp_path / "o.jsonl"), *extra], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr, r.stderr


@pytest.mark.parametrize("timelines", [False, True], ids=["one-timeline", "by-device"])
def test_a_query_added_to_workers_admits_what_the_single_service_does(tmp_path, timelines):
    """Issue 49 item 6: an event late by the records before a live add (and a repeat of
    an event id from before it) was left out by the single service and matched by the
    added query's worker consumer, which started at its control record knowing nothing
    of the stream before it: the same journal gave 1 match and 2. A running consumer
    writes the admission down at the record; the new one waits for it and starts from
    it. By device (--timeline, spec section 7) the admission is each device's timeline
    too: d1's Motion at 46 s is late on d1's timeline (T = 50 s), though the stream
    admits d2's Door at 45 s."""
    from dqcep.io.journal import Journal, JournalView
    from dqcep.service.changes import CONTROL_TOPIC, control_record
    from dqcep.service.streaming import ServiceConfig, StreamingService
    from dqcep.service.worker import query_config, set_up_added
    (tmp_path / "q.cep").write_text("QUERY d PATTERN Door x WITHIN 1 s;\n")
    added = "QUERY later PATTERN SEQ(Door x, Motion y) WITHIN 10 s\n"

    def ev(i, etype, ts, device="d1"):
        return msgpack.packb({"events": [{"type": etype, "ts": ts, "id": i,
                                          "device": device}]})
    journal = Journal(tmp_path / "journal")
    journal.append("s", ev(1, "Door", 50_000), 1)
    control = journal.append(CONTROL_TOPIC, control_record("add", text=added), 2)
    stream = [(7, "Door", 45_000, "d2"), (3, "Motion", 46_000, "d1")] if timelines else \
        [(2, "Door", 1_000, "d1"), (3, "Motion", 2_000, "d1")]  # late by id 1
    for i, etype, ts, device in stream + [(1, "Door", 50_000, "d1"),  # id 1 again
                                          (4, "Door", 55_000, "d1"), (5, "Motion", 56_000, "d1"),
                                          (6, "Door", 90_000, "d1")]:
        journal.append("s", ev(i, etype, ts, device), 3)
    journal.commit()
    end = journal.durable_offset
    journal.close()
    base = ServiceConfig(queries=str(tmp_path / "q.cep"), inputs=["mqtt://127.0.0.1:9/s"],
                         journal=str(tmp_path / "journal"), checkpoint=str(tmp_path / "ck"),
                         output=str(tmp_path / "single.jsonl"),
                         dead_letter=str(tmp_path / "dead.jsonl"),
                         late=str(tmp_path / "late.jsonl"), state=str(tmp_path / "state"),
                         **({"lateness": 1000, "skew": 10_000, "timeline": "device"}
                            if timelines else {}))

    def later_matches(path):
        return sorted(tuple(json.loads(x)["events"].values()) for x in Path(path).read_text()
                      .splitlines() if json.loads(x)["query"] == "later")
    single = StreamingService(base)
    single.step()
    single.close()
    assert later_matches(base.output) == [(4, 5)]
    # the same journal under workers: the added query's consumer as the coordinator
    # sets it up at the record (its text, its first offset), the file's query's consumer
    workers = ServiceConfig(**{**base.__dict__, "output": str(tmp_path / "out.jsonl")})
    set_up_added(workers, "later", control, added + ";\n")
    durable = lambda: end  # noqa: E731
    new = StreamingService(query_config(workers, "later"),
                           journal=JournalView(workers.journal, durable))
    running = StreamingService(query_config(workers, "d"),
                               journal=JournalView(workers.journal, durable))
    assert new.step() == 0 and new.offset == control + 1  # waits: nothing written yet
    new.checkpoint()  # (a checkpoint while it waits: it waits again after a restart)
    new.close()
    new = StreamingService(query_config(workers, "later"),
                           journal=JournalView(workers.journal, durable))
    assert new.step() == 0 and new.waiting_for_admission
    running.step()
    new.step()
    for svc in (new, running):
        svc.close()
    assert later_matches(tmp_path / "out.later.jsonl") == later_matches(base.output)
