"""The streaming service against a real Mosquitto: end to end, SIGKILL + restart, dead letters."""
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack

from dqcep.events import event_from_mapping
from dqcep.lang import parse_file
from dqcep.reference import ReferenceMatcher

ROOT = Path(__file__).resolve().parent.parent
QUERIES = ROOT / "dqcep" / "data" / "iot.cep"


def gen_args(n, topic_url, extra=()):
    return [sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n", str(n),
            "--seed", "5", "--batch-size", "200", "--plant", str(QUERIES),
            "--plant-every", "130000", "--quiet", "--truth", os.devnull, *extra,
            "-o", topic_url]


def expected_matches(n, tmp_path, extra=()):
    """The same stream as a file, matched by the reference: what the service must print."""
    out = tmp_path / "stream.msgpack"
    subprocess.run(gen_args(n, str(out), extra), check=True)
    good = []
    for payload in msgpack.Unpacker(open(out, "rb"), raw=False):
        for e in payload["events"]:
            try:
                good.append(event_from_mapping(e))
            except Exception:
                pass
    seen, events = set(), []
    for e in good:  # duplicates: the service keeps the first
        if e.id not in seen:
            seen.add(e.id)
            events.append(e)
    ms = ReferenceMatcher(parse_file(QUERIES).queries).run(events)
    return {json.dumps(m.to_json_obj()) for m in ms}, len(events)


class Service:
    def __init__(self, tmp_path, url):
        self.args = [sys.executable, "-m", "dqcep", "run", str(QUERIES), "--input", url,
                     "--journal", str(tmp_path / "journal"), "--checkpoint",
                     str(tmp_path / "ck.bin"), "-o", str(tmp_path / "out.jsonl"),
                     "--stats-file", str(tmp_path / "stats.json"), "--stats-every", "0.2"]
        self.tmp = tmp_path
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(self.args, stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        assert "listening on" in line, line + self.proc.stderr.read()

    def events_in(self):
        try:
            return json.loads((self.tmp / "stats.json").read_text())["events_in"]
        except (FileNotFoundError, json.JSONDecodeError):
            return 0

    def wait_for(self, n, timeout=60):
        deadline = time.monotonic() + timeout
        while self.events_in() < n and time.monotonic() < deadline:
            time.sleep(0.1)
        assert self.events_in() >= n, (self.events_in(), n)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0, self.proc.stderr.read()

    def output(self):
        lines = (self.tmp / "out.jsonl").read_text().splitlines()
        assert len(lines) == len(set(lines)), "a match was written twice"
        return set(lines)


def test_end_to_end_matches_equal_the_reference(mosquitto, tmp_path):
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/e2e"
    want, n_events = expected_matches(20_000, tmp_path)
    svc = Service(tmp_path, url)
    svc.start()
    subprocess.run(gen_args(20_000, url), check=True)
    svc.wait_for(n_events)
    svc.stop()
    assert svc.output() == want and len(want) > 50


def test_sigkill_mid_stream_loses_and_repeats_nothing(mosquitto, tmp_path):
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/kill"
    extra = ("--malformed", "0.002", "--duplicates", "0.01")
    want, n_events = expected_matches(40_000, tmp_path, extra)
    svc = Service(tmp_path, url)
    svc.start()
    pub = subprocess.Popen(gen_args(40_000, url, extra + ("--rate", "20000")))
    svc.wait_for(8_000)
    svc.proc.kill()                         # SIGKILL mid-stream
    svc.proc.wait()
    time.sleep(0.5)                         # the broker queues for the persistent session
    svc.start()
    assert pub.wait(60) == 0
    svc.wait_for(n_events)
    svc.stop()
    assert svc.output() == want
    dead = [json.loads(x) for x in (tmp_path / "out.jsonl.dead-letter.jsonl").read_text()
            .splitlines()]
    assert dead and all(d["reason"] and d["payload"] for d in dead)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["malformed"] == len(dead) and stats["duplicates"] > 0
