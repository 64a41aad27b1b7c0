"""MQTT ingest throughput: a local Mosquitto -> the streaming service -> the engine.

Starts its own Mosquitto on a free loopback port and runs the service
(``dqcep run dqcep/data/iot.cep --input mqtt://...``, journal fsync on, QoS 1)
as a subprocess. A separate publisher process (``dqcep generate --output
mqtt://...``) sends N IoT events in msgpack batches. Two measurements, one run:

- live: the publisher and the service run at once (on 2 cores they share the
  CPU with Mosquitto); events/s from the first event the service takes in to
  the last. When the service keeps up, the publisher is the limit: compare
  the publisher's own rate, printed with the backlog figure.
- backlog: the service's persistent session is made, the service stopped, the
  stream published into the broker's queue, then the service started again:
  events/s draining the backlog, the service alone.

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
TARGET = 500_000


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


class Service:
    def __init__(self, tmp: Path, url: str, client_id: str):
        tmp.mkdir()
        self.stats = tmp / "stats.json"
        self.cmd = [sys.executable, "-m", "dqcep", "run", str(QUERIES), "--input", url,
                    "--client-id", client_id,
                    "--journal", str(tmp / "journal"), "--checkpoint", str(tmp / "ck"),
                    "-o", str(tmp / "out.jsonl"), "--stats-file", str(self.stats),
                    "--stats-every", "0.05"]
        self.proc = None

    def start(self) -> None:
        self.stats.unlink(missing_ok=True)
        self.proc = subprocess.Popen(self.cmd, stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        if "listening" not in line:
            raise SystemExit(f"the service did not start: {line}{self.proc.stderr.read()}")

    def read(self) -> dict:
        try:
            return json.loads(self.stats.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def rate_until(self, total: int) -> tuple[float, dict]:
        """events/s from the first event taken in until ``total`` are in."""
        first = None
        while (s := self.read()).get("events_in", 0) < total:
            if s.get("events_in") and first is None:
                first = (time.perf_counter(), s["events_in"])
            if self.proc.poll() is not None:
                raise SystemExit(f"the service stopped: {self.proc.stderr.read()}")
            time.sleep(0.01)
        last = time.perf_counter()
        t0, n0 = first or (last, total)
        return (total - n0) / max(last - t0, 1e-9), s

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def publish(url: str, events: int, batch: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n", str(events),
         "--batch-size", str(batch), "--quiet", "-o", url])


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
        services = []
        try:
            # live: publisher and service at once
            svc = Service(tmp / "live", url, "bench-live")
            services.append(svc)
            svc.start()
            pub = publish(url, args.events, args.batch_size)
            live, _ = svc.rate_until(args.events)
            pub.wait()
            svc.stop()
            # backlog: a second service (own session and state) subscribes, stops; the
            # broker queues the stream for it; it drains the queue
            svc = Service(tmp / "backlog", url, "bench-backlog")
            services.append(svc)
            svc.start()
            svc.stop()
            started = time.perf_counter()
            publish(url, args.events, args.batch_size).wait()
            queued = args.events / (time.perf_counter() - started)
            svc.start()
            backlog, stats = svc.rate_until(args.events)
            svc.stop()
        finally:
            for svc in services:
                if svc.proc.poll() is None:
                    svc.stop()
            broker.terminate()
            broker.wait(10)
    print(f"events={args.events} batch={args.batch_size} (iot.cep, journal fsync every 10 ms)")
    print(f"live:    {live:>11,.0f} events/s into the engine, publisher running")
    print(f"backlog: {backlog:>11,.0f} events/s draining the broker's queue (the publisher "
          f"alone: {queued:,.0f} events/s, process start included)")
    print(f"matches out {stats['matches_out']:,}, malformed {stats['malformed']}, "
          f"duplicates {stats['duplicates']}, late {stats['late']}")
    print(f"target {TARGET:,}: live {live / TARGET:.2f}x, backlog {backlog / TARGET:.2f}x")


if __name__ == "__main__":
    main()
