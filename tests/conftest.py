"""Shared fixtures: a real Mosquitto broker started for the tests (never one left running),
and dqcep built as a wheel."""
import shutil
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def wheel(tmp_path_factory, worker_id):
    """dqcep built as a wheel from this checkout, once per run: the kernels compile for
    a minute or more, and under pytest-xdist each test process has its own session (two
    processes built it side by side in .ci/run). The first to need it builds it under a
    lock in the run's shared temporary directory; the others wait and take it."""
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
                            str(out), str(root)], check=True, cwd=out)
    (built,) = out.glob("dqcep-*.whl")
    return built


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mosquitto_binary() -> str:
    binary = shutil.which("mosquitto") or ("/usr/sbin/mosquitto"
                                           if shutil.which("/usr/sbin/mosquitto") else None)
    assert binary, "Mosquitto is not installed (apt-get install -y mosquitto)"
    return binary


def start_mosquitto(conf, port: int) -> subprocess.Popen:
    """Start Mosquitto with a config file and wait until it accepts connections on port.

    Fails (never skips) when Mosquitto is not installed or does not come up.
    """
    proc = subprocess.Popen([mosquitto_binary(), "-c", str(conf)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                raise AssertionError(f"Mosquitto did not start on port {port}: {out}")
            time.sleep(0.05)


def stop_mosquitto(proc: subprocess.Popen) -> None:
    proc.terminate()  # Mosquitto saves its persistence database on SIGTERM
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


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


@contextmanager
def subscribed(host: str, port: int, topic: str, client_id: str, with_topics: bool = False):
    """A QoS 1 subscriber; yields the list its payloads (``with_topics``: (topic,
    payload) pairs) are appended to, once subscribed."""
    import paho.mqtt.client as mqtt

    received, ready = [], threading.Event()
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
    sub.on_connect = lambda c, u, f, rc, p: c.subscribe(topic, qos=1)
    sub.on_subscribe = lambda c, u, mid, rcs, p: ready.set()
    sub.on_message = lambda c, u, msg: received.append(
        (msg.topic, msg.payload) if with_topics else msg.payload)
    sub.connect(host, port)
    sub.loop_start()
    try:
        assert ready.wait(10), f"no subscription to {topic}"
        yield received
    finally:
        sub.loop_stop()
        sub.disconnect()


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
    """A PostgreSQL server on a free loopback port for the session (tests/postgres.py)."""
    from tests.postgres import PostgresServer
    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres(postgres_server):
    """The URL of a fresh database on the session's PostgreSQL server."""
    return postgres_server.new_database()


# Processes a test starts that must not outlive it (a failing assertion between start
# and stop once left a streaming service running for hours): killed after each test.
LIVE_PROCESSES: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test():
    yield
    while LIVE_PROCESSES:
        proc = LIVE_PROCESSES.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
