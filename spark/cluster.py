"""A local standalone Spark cluster (master + workers) from the pip-installed pyspark.

The pyspark wheel has no ``sbin/start-*.sh``, but ``bin/spark-class`` starts the
master and worker daemons (it ends in ``exec java``, so the process started is
the JVM: it is stopped by its PID). ``dqcep spark cluster start`` writes the
PIDs and the master URL to a state directory; ``stop`` reads them back.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dqcep.core.errors import UserError

STATE = "cluster.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_class() -> str:
    import pyspark
    path = Path(pyspark.__file__).parent / "bin" / "spark-class"
    if not path.exists():
        raise UserError(f"{path} is missing: is pyspark installed from pip?")
    return str(path)


def _wait_port(port: int, proc: subprocess.Popen, what: str, log: Path, timeout=60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise UserError(f"the Spark {what} exited; see {log}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.2)
    raise UserError(f"the Spark {what} did not listen on port {port} within {timeout} s; "
                    f"see {log}")


def _workers_alive(ui_port: int) -> int:
    """How many workers the master lists as ALIVE (its JSON status page); 0 while the
    page cannot be read, or its UI, still starting, answers with no JSON."""
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
            status = json.load(r)
    except (OSError, ValueError):  # ValueError: an empty or partial page
        return 0
    workers = status.get("workers", []) if isinstance(status, dict) else []
    return sum(1 for w in workers if isinstance(w, dict) and w.get("state") == "ALIVE")


def start_cluster(state_dir: str | Path, workers: int = 2, cores: int = 1,
                  memory: str = "1g", timeout: float = 60) -> dict:
    """Start a master and ``workers`` workers on free loopback ports; returns the state."""
    state_dir = Path(state_dir)
    if (state_dir / STATE).exists():
        raise UserError(f"a cluster is already recorded in {state_dir}; stop it first")
    state_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    env.pop("SPARK_HOME", None)  # a stale SPARK_HOME breaks spark-class
    port, ui = _free_port(), _free_port()
    procs = []

    def launch(name, args):
        log = state_dir / f"{name}.log"
        proc = subprocess.Popen([spark_class(), *args], env=env, stdout=open(log, "wb"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        procs.append({"name": name, "pid": proc.pid, "log": str(log)})
        return proc, log

    try:
        master, log = launch("master", ["org.apache.spark.deploy.master.Master", "--host",
                                        "127.0.0.1", "--port", str(port), "--webui-port",
                                        str(ui)])
        _wait_port(port, master, "master", log, timeout)
        url = f"spark://127.0.0.1:{port}"
        for i in range(workers):
            work = state_dir / f"work-{i}"
            launch(f"worker-{i}", ["org.apache.spark.deploy.worker.Worker", url, "--host",
                                   "127.0.0.1", "--cores", str(cores), "--memory", memory,
                                   "--webui-port", str(_free_port()), "--work-dir", str(work)])
        deadline = time.monotonic() + timeout
        while _workers_alive(ui) < workers:
            if time.monotonic() > deadline:
                raise UserError(f"only {_workers_alive(ui)} of {workers} workers registered "
                                f"within {timeout} s; see the logs in {state_dir}")
            time.sleep(0.3)
    except BaseException:
        _kill(procs)
        raise
    state = {"master": url, "ui_port": ui, "workers": workers, "cores": cores,
             "memory": memory, "processes": procs}
    (state_dir / STATE).write_text(json.dumps(state, indent=2) + "\n")
    return state


def _kill(procs) -> None:
    for p in reversed(procs):
        try:
            os.killpg(p["pid"], signal.SIGTERM)
        except ProcessLookupError:
            continue
    for p in reversed(procs):
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.kill(p["pid"], 0)
            except ProcessLookupError:
                break
            try:  # reap it if it is our child
                if os.waitpid(p["pid"], os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                pass
            time.sleep(0.1)
        else:
            try:
                os.killpg(p["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


def stop_cluster(state_dir: str | Path) -> dict:
    path = Path(state_dir) / STATE
    if not path.exists():
        raise UserError(f"no cluster recorded in {state_dir}")
    state = json.loads(path.read_text())
    _kill(state["processes"])
    path.unlink()
    return state
