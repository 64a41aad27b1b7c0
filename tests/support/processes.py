"""Every process a test starts, so that none outlives its test or the run.

conftest.py puts ``TrackedPopen`` in place of ``subprocess.Popen`` (``subprocess.run``
goes through it too). What a test's body started is killed after the test; whatever is
still alive when the session ends (an interrupted run: Ctrl-C reaches pytest, not a
process started in a session of its own) is killed then. A process that leads a
process group of its own (``start_new_session=True``: ``dqcep spark stream`` and its
JVM) is killed with its whole group."""
from __future__ import annotations

import os
import signal
import subprocess

STARTED: list[subprocess.Popen] = []
_Popen = subprocess.Popen


class TrackedPopen(_Popen):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        STARTED.append(self)


def install() -> None:
    subprocess.Popen = TrackedPopen


def kill(procs) -> None:
    """Kill each process still running (with its group when it leads one) and reap it."""
    for proc in procs:
        if proc.poll() is not None:
            continue
        try:
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        except ProcessLookupError:
            pass
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
