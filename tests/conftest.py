"""Shared fixtures (a real Mosquitto broker per test, one Spark session, a PostgreSQL
server, dqcep built as a wheel), the Hypothesis profiles, the ``integration`` marker and
the tracking of every process a test starts. The harnesses are in tests/support/."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support import examples, jvm, processes
from tests.support.broker import free_port, start_mosquitto, stop_mosquitto


@pytest.fixture(scope="session")
def wheel(tmp_path_factory, worker_id):
    """dqcep built as a wheel from this checkout, once per run: the kernels compile for
    a minute or more, and under pytest-xdist each test process has its own session (two
    processes built it side by side in .ci/run). The first to need it builds it under a
    lock in the run's shared temporary directory; the others wait and take it. Its kernels
    are those the editable install compiled from the same sources, where they are newer
    than every kernel source (DQCEP_REUSE_INPLACE_KERNELS, setup.py): compiling them again
    took 100-217 s of a loaded .ci/run; stale ones are compiled."""
    import fcntl
    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent  # the run's directory, above each process's own
    out = shared / "wheel"
    with open(shared / "wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not list(out.glob("dqcep-*.whl")):
            out.mkdir(exist_ok=True)
            root = Path(__file__).resolve().parent.parent
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                            str(out), str(root)], check=True, cwd=out,
                           env={**os.environ, "DQCEP_REUSE_INPLACE_KERNELS": "1"})
    (built,) = out.glob("dqcep-*.whl")
    return built


@pytest.fixture
def mosquitto(tmp_path_factory):
    """(host, port) of a Mosquitto broker on a free loopback port; stopped afterwards.

    One broker per test: a broker shared by the run kept each client id's persistent
    session from test to test, so what one test left queued (a docs command's stream
    under the default client id, redelivered messages) reached the next service of
    that id, whose events it turned into repeats or dead letters."""
    port = free_port()
    conf = tmp_path_factory.mktemp("mosquitto") / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                    "max_queued_messages 0\n")
    proc = start_mosquitto(conf, port)
    yield "127.0.0.1", port
    stop_mosquitto(proc)


@pytest.fixture(scope="session")
def spark():
    """One local[2] Spark session for every test that needs one (a JVM start each is
    too slow), stopped at the end."""
    from dqcep.spark.session import spark_session
    session = spark_session("local[2]", "dqcep-tests", partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server on a free loopback port for the session (tests/support/postgres.py)."""
    from tests.support.postgres import PostgresServer
    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres(postgres_server):
    """The URL of a fresh database on the session's PostgreSQL server."""
    return postgres_server.new_database()


# The JVMs the tests start (the Spark session, each `dqcep spark` command, the standalone
# cluster's daemons and executors) live for seconds to minutes: C1 only, one serial
# collector, and a class-data archive made once per machine (tests/support/jvm.py).
os.environ.setdefault("JAVA_TOOL_OPTIONS", jvm.java_options())

# Hypothesis: the full run's counts under its default and ci profiles; ``dev`` a tenth
# (tests/support/examples.py; the README's quick command).
settings.register_profile("dev", max_examples=examples.DEV)

# Every process a test starts is tracked (a failing assertion between start and stop
# once left a streaming service running for hours; an interrupted run left a `dqcep
# spark stream` and its JVM): tests/support/processes.py.
processes.install()

# A test is an integration test when it needs a component or starts a process: these
# fixtures mark it; a module or a test that starts processes itself says so with
# ``pytest.mark.integration`` (a test that starts one unmarked fails: below).
INTEGRATION_FIXTURES = {"mosquitto", "spark", "wheel", "postgres", "postgres_server"}


def pytest_collection_modifyitems(items):
    for item in items:
        if INTEGRATION_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.integration)


def pytest_collection_finish(session):
    """A run that selects a Spark test has the JVMs' class-data archive made meanwhile,
    unless JAVA_TOOL_OPTIONS are the caller's own (tests/support/jvm.py)."""
    if os.environ["JAVA_TOOL_OPTIONS"] == jvm.java_options() and any(
            "spark" in item.nodeid for item in session.items):
        jvm.start_archive()


def _unmarked_processes(item, started: list) -> None:
    if started and item.get_closest_marker("integration") is None:
        raise AssertionError(
            f"{item.nodeid} started {len(started)} process(es) ({started[0].args!r:.120}) "
            "and is not marked integration: mark it (pytest.mark.integration), so that "
            "the quick run (-m 'not integration') leaves it out")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    first = len(processes.STARTED)
    result = yield  # processes its fixtures start are theirs to stop
    _unmarked_processes(item, processes.STARTED[first:])
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    first = len(processes.STARTED)
    try:
        result = yield
    finally:
        started = processes.STARTED[first:]
        processes.kill(started)  # what the test's body started never outlives it
        del processes.STARTED[first:]
    _unmarked_processes(item, started)
    return result


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """After the fixtures' own teardown: whatever is still running (an interrupted run)."""
    processes.kill(processes.STARTED)
