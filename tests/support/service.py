"""dqcep's service as a user starts it (``python -m dqcep run ... --input mqtt://``, one
service or a coordinator with workers), the generator publishing to a broker, and what
the reference matcher says the output must be."""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import msgpack

from dqcep.core.events import event_from_mapping
from dqcep.lang import parse_file
from dqcep.baseline.reference import ReferenceMatcher
from tests.support.paths import ROOT

QUERIES = ROOT / "dqcep" / "data" / "iot.cep"


def gen_args(n, topic_url, extra=(), queries=QUERIES):
    return [sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n", str(n),
            "--seed", "5", "--batch-size", "200", "--plant", str(queries),
            "--plant-every", "130000", "--quiet", "--truth", os.devnull, *extra,
            "-o", topic_url]


def expected_matches(n, tmp_path, extra=(), queries=QUERIES, plant=None):
    """The same stream as a file, matched by the reference: what the service must print.
    ``plant``: the queries the generator plants matches of (default: ``queries``)."""
    out = tmp_path / "stream.msgpack"
    subprocess.run(gen_args(n, str(out), extra, plant or queries), check=True)
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
    ms = ReferenceMatcher(parse_file(queries).queries).run(events)
    return {json.dumps(m.to_json_obj()) for m in ms}, len(events)


def publish_all(host, port, topic, payloads, client_id="hostile"):
    import paho.mqtt.client as mqtt
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
    pub.connect(host, port)
    pub.loop_start()
    infos = [pub.publish(topic, p, qos=1) for p in payloads]
    for info in infos:
        info.wait_for_publish(60)
    pub.disconnect()
    pub.loop_stop()


# The generator's events carry synthetic times from 0: a tick at the wall clock (spec
# section 7) after a pause would make every later one late. The tests of ticks give
# their own --tick after this one (the last one given counts).
NO_TICKS = ("--tick", "0")


class Service:
    def __init__(self, tmp_path, url, queries=QUERIES):
        self.args = [sys.executable, "-m", "dqcep", "run", str(queries), "--input", url,
                     "--journal", str(tmp_path / "journal"), "--checkpoint",
                     str(tmp_path / "ck.bin"), "-o", str(tmp_path / "out.jsonl"),
                     "--stats-file", str(tmp_path / "stats.json"), "--stats-every", "0.2",
                     *NO_TICKS]
        self.tmp = tmp_path
        self.proc = None
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []

    def start(self, before=0, **popen):
        """Start and wait for "listening on" (after ``before`` other lines, and the
        queries' warnings: ``dqcep.cli.common.warn_plan``). stderr is read all the time
        by a thread: the stats line comes every 0.2 s, and a pipe nobody reads fills
        (64 KiB, about a minute of them) and then blocks the service mid-write, which
        a long or loaded run once hit."""
        self.proc = subprocess.Popen(self.args, stderr=subprocess.PIPE, text=True, **popen)
        self.lines = queue.Queue()
        self.reader = threading.Thread(target=self._read_stderr,
                                       args=(self.proc.stderr, self.lines), daemon=True)
        self.reader.start()
        for _ in range(before):  # lines said before it (the workers' placement)
            self.next_line(60)
        line = self.next_line(60)
        while ": warning: " in line:
            line = self.next_line(60)
        assert "listening on" in line, line + self.log()

    def _read_stderr(self, pipe, lines):
        for line in pipe:
            self.stderr.append(line)
            lines.put(line)
        lines.put("")  # the end

    def next_line(self, timeout=30) -> str:
        """The service's next stderr line ("" at its end or after ``timeout`` s)."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return ""

    def log(self) -> str:
        """Everything the service wrote to stderr (all of it once it has exited)."""
        if self.proc.poll() is not None:
            self.reader.join(10)
        return "".join(self.stderr)

    def events_in(self, counter="events_in"):
        try:
            return json.loads((self.tmp / "stats.json").read_text())[counter]
        except (FileNotFoundError, json.JSONDecodeError):
            return 0

    def wait_for(self, n, timeout=60, counter="events_in"):
        deadline = time.monotonic() + timeout
        while self.events_in(counter) < n and time.monotonic() < deadline:
            time.sleep(0.1)
        assert self.events_in(counter) >= n, (self.events_in(counter), n, self.said("cannot"),
                                              self.log()[-3000:])

    def said(self, word: str) -> list[str]:
        """The service's stderr lines with ``word`` (what went wrong, before the stats)."""
        return [line for line in self.stderr if word in line]

    def kill_and_restart(self, while_down=lambda: None):
        """SIGKILL mid-stream, ``while_down()``, then start again (the broker queues for
        the persistent session meanwhile)."""
        self.proc.kill()
        self.proc.wait()
        while_down()
        time.sleep(0.5)
        self.start()

    def stop(self):
        """SIGTERM: a pause for a restart (held matches stay in the checkpoint)."""
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0, self.log()

    def finish(self):
        """SIGUSR1: the end of the stream (held matches out), then exit."""
        self.proc.send_signal(signal.SIGUSR1)
        assert self.proc.wait(30) == 0, self.log()

    def after_the_publisher(self, pub, n_events):
        """The publisher done, every event in, the end of the stream: the output."""
        assert pub.wait(60) == 0
        self.wait_for(n_events)
        self.finish()
        return self.output()

    def output(self):
        lines = (self.tmp / "out.jsonl").read_text().splitlines()
        assert len(lines) == len(set(lines)), "a match was written twice"
        return set(lines)


class Workers:
    def __init__(self, tmp_path, url, *extra, queries=QUERIES):
        self.tmp = tmp_path
        self.names = [q.name for q in parse_file(str(queries)).queries]
        self.args = [sys.executable, "-m", "dqcep", "run", str(queries), "--input", url,
                     "--state", str(tmp_path / "state"), "-o", str(tmp_path / "out.jsonl"),
                     "--stats-file", str(tmp_path / "stats.json"), "--stats-every", "0.2",
                     *NO_TICKS, *extra]

    def start(self):
        self.log = open(self.tmp / "stderr.txt", "a")
        self.proc = subprocess.Popen(self.args, stderr=self.log)
        deadline = time.monotonic() + 60
        while "listening on" not in (self.tmp / "stderr.txt").read_text().split(
                "--- restart ---")[-1]:
            assert self.proc.poll() is None and time.monotonic() < deadline, \
                (self.tmp / "stderr.txt").read_text()
            time.sleep(0.05)

    def stats(self):
        try:
            return json.loads((self.tmp / "stats.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def wait_for(self, events, timeout=60):
        deadline = time.monotonic() + timeout
        while self.stats().get("events_in", 0) < events:
            assert time.monotonic() < deadline, (self.stats(), self.stderr())
            time.sleep(0.1)

    def stderr(self):
        return (self.tmp / "stderr.txt").read_text()

    def finish(self):
        self.proc.send_signal(signal.SIGUSR1)
        assert self.proc.wait(60) == 0, self.stderr()

    def output(self):
        lines = [line for q in self.names
                 for line in (self.tmp / f"out.{q}.jsonl").read_text().splitlines()]
        assert len(lines) == len(set(lines)), "a match was written twice"
        return set(lines)
