"""MQTT ingest throughput: a local Mosquitto -> the streaming service -> the engine.

Starts its own Mosquitto on a free loopback port and the service
(``dqcep run ... --input mqtt://...``) as a subprocess, then publishes N IoT
events in msgpack batches from a separate publisher process
(``dqcep generate --output mqtt://...``), and measures from the first event the
service takes in to the last: events/s through journal, decoding and engine.
The target from the streaming issue is >= 500,000 events/s.

    python3 bench/bench_ingest.py [--events N] [--batch-size B]
"""
from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUERIES = Path(__file__).resolve().parent.parent / "dqcep" / "data" / "iot.cep"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on port {port}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=500_000)
    ap.add_argument("--batch-size", type=int, default=1000)
    args = ap.parse_args(argv)
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        port = free_port()
        (tmp / "m.conf").write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                                    "max_queued_messages 0\n")
        broker = subprocess.Popen([binary, "-c", str(tmp / "m.conf")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(port)
        url = f"mqtt://127.0.0.1:{port}/bench"
        stats = tmp / "stats.json"
        service = subprocess.Popen(
            [sys.executable, "-m", "dqcep", "run", str(QUERIES), "--input", url, "--journal",
             str(tmp / "journal"), "--checkpoint", str(tmp / "ck"), "-o", str(tmp / "out.jsonl"),
             "--stats-file", str(stats), "--stats-every", "0.05"],
            stderr=subprocess.PIPE, text=True)
        assert "listening" in service.stderr.readline()
        publisher = subprocess.Popen(
            [sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n",
             str(args.events), "--batch-size", str(args.batch_size), "--quiet", "-o", url])

        def events_in():
            try:
                return json.loads(stats.read_text())["events_in"]
            except (FileNotFoundError, json.JSONDecodeError):
                return 0

        first = None
        while (n := events_in()) < args.events:
            if n and first is None:
                first = (time.perf_counter(), n)
            time.sleep(0.01)
        last = time.perf_counter()
        publisher.wait()
        service.terminate()
        service.wait(30)
        broker.terminate()
        broker.wait(10)
    t0, n0 = first
    rate = (args.events - n0) / (last - t0)
    print(f"events={args.events} batch={args.batch_size}: {rate:,.0f} events/s through "
          f"MQTT -> journal -> decode -> engine (target 500,000: "
          f"{rate / 500_000:.2f} of it)")


if __name__ == "__main__":
    main()
