"""The test harness itself (tests/support/processes.py, conftest.py): a process a test
starts never outlives it or an interrupted run, and a test that starts one must be
marked integration, so that the quick subset holds no such test."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.integration  # it runs pytest in a process

SLEEPER = '''
import subprocess, sys, time
import pytest

@pytest.mark.integration
def test_starts_a_process_in_a_session_of_its_own(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                            start_new_session=True)
    (PIDS / "sleeper").write_text(str(proc.pid))
    time.sleep(300)

def test_starts_a_process_unmarked():
    subprocess.run(["true"], check=True)
'''


def default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def inner_pytest(tmp_path, *args) -> subprocess.Popen:
    test = tmp_path / "test_inner.py"
    test.write_text(f"from pathlib import Path\nPIDS = Path({str(tmp_path)!r})\n" + SLEEPER)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # SIGINT as a terminal's foreground job has it: a run started in the background by a
    # non-interactive shell (`cmd &`) inherits SIGINT ignored, and Ctrl-C would do nothing.
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest",
                             "-p", "no:cacheprovider", str(test), *args], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=default_sigint)


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in state  # a zombie no one has reaped yet has ended


def test_an_interrupted_run_leaves_no_process_behind(tmp_path):
    """Ctrl-C (SIGINT to pytest) while a test waits on a process it started in a session
    of its own, which the terminal's SIGINT does not reach: it is killed all the same."""
    run = inner_pytest(tmp_path, "-k", "session_of_its_own")
    deadline = time.monotonic() + 60
    while not (tmp_path / "sleeper").exists():
        assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()
        time.sleep(0.05)
    pid = int((tmp_path / "sleeper").read_text())
    try:
        assert not gone(pid)
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=60)
        assert "KeyboardInterrupt" in out, out
        assert gone(pid), out
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_test_that_starts_a_process_unmarked_fails(tmp_path):
    run = inner_pytest(tmp_path, "-k", "unmarked")
    out, _ = run.communicate(timeout=60)
    assert run.returncode == 1, out
    assert "started 1 process(es) (['true']) and is not marked integration" in out, out
