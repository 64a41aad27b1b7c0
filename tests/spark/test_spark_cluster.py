"""dqcep spark cluster and dqcep spark pack: a standalone cluster of several processes,
a job on it with the executors on a packed environment. Apart from tests/spark/test_spark.py's
group: it starts a cluster of its own, not the session's local[2]."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.spark_jobs import IMPERFECT, LATENESS, QUERIES, expected, generate, job_lines
from tests.support.paths import ROOT


pytestmark = pytest.mark.integration


def test_cluster_start_waits_through_a_master_ui_still_starting():
    """The master's status page answers with nothing, then half a page, then JSON:
    the worker count reads 0 until it is JSON (a start no longer fails on it)."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from dqcep.spark.cluster import _workers_alive
    pages = [b"", b'{"workers": [', json.dumps({"workers": [
        {"state": "ALIVE"}, {"state": "DEAD"}, {"state": "ALIVE"}]}).encode(), b"[]"]

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages.pop(0)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    server = HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert [_workers_alive(port) for _ in range(4)] == [0, 0, 2, 0]
    finally:
        server.shutdown()


def test_scripted_standalone_cluster(tmp_path, wheel):
    """dqcep spark cluster start (master + 2 workers from the pip pyspark), a job on its
    spark:// master with the executors on a packed environment (dqcep spark pack, shipped
    with --archive), stop: the processes are gone. Two executor JVMs with their own
    Python workers give the same matches. The executors' Python is the archive's, an
    isolated venv, so their dqcep is the archive's and not this machine's (the job's
    _stats.json says where its tasks ran: it was a second application, 30 s)."""
    events = generate(tmp_path / "events.jsonl", 4000, *IMPERFECT)
    want, _, _ = expected([events])
    archive = tmp_path / "env.tar.gz"
    pack = subprocess.run([sys.executable, "-m", "dqcep", "spark", "pack", "-o", str(archive),
                           "--source", str(wheel), "--compress-level", "1"],
                          capture_output=True, text=True, timeout=600)
    assert pack.returncode == 0 and archive.stat().st_size > 0, pack.stderr
    state = tmp_path / "cluster"
    start = subprocess.run([sys.executable, "-m", "dqcep", "spark", "cluster", "start",
                            "--workers", "2", "--cores", "1", "--memory", "1g",  # docs/spark.md
                            "--dir", str(state)], capture_output=True, text=True, timeout=120)
    assert start.returncode == 0, start.stderr
    master = start.stdout.strip()
    try:
        assert master.startswith("spark://127.0.0.1:")
        run = subprocess.run(
            [sys.executable, "-m", "dqcep", "spark", "run", str(QUERIES), "-i", str(events),
             "-o", str(tmp_path / "out"), "--master", master, "--lateness", str(LATENESS),
             "--archive", str(archive)], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        assert set(job_lines(tmp_path / "out")) == want and want
        # without --partitions, one partition per core of the cluster (2; the default
        # was 4, which on one 2-core executor took 31 s for 2x10^6 events where 2 took 18)
        stats = json.loads((tmp_path / "out" / "_stats.json").read_text())
        assert stats["partitions"] == 2
        # its steps as they start (it was Spark's warnings only for a minute)
        assert "dqcep spark run [" in run.stderr and "stage 2 of 2: routing" in run.stderr
        assert "matches ->" in run.stderr
        # where the tasks that read the events (the Python data source) and matched them
        # (mapInArrow) ran, as each said in its counts
        seen = stats["executors"]
        assert len({Path(e).parts[:-3] for e, _, _ in seen}) >= 2, seen  # both workers'
        for executable, prefix, module in seen:
            assert executable.endswith("environment/bin/python"), executable
            assert str(state) in executable  # unpacked into a worker's work directory
            assert module.startswith(prefix) and str(ROOT) not in module, (prefix, module)
    finally:
        pids = [p["pid"] for p in json.loads((state / "cluster.json").read_text())["processes"]]
        stop = subprocess.run([sys.executable, "-m", "dqcep", "spark", "cluster", "stop",
                               "--dir", str(state)], capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0, stop.stderr
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
