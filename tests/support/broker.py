"""A Mosquitto broker for a test, and an MQTT subscriber: started as subprocesses on
free loopback ports, never one left running (the ``mosquitto`` fixture in conftest.py
starts one per test)."""
import shutil
import socket
import subprocess
import threading
import time
from contextlib import contextmanager


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
