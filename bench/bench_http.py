"""The HTTP side's cost: the service's events/s with ``--http`` on and a client
scraping ``/metrics`` (and ``/status``) every second, against the same service with it
off, in one run (issue 39's target: >= 0.95x).

Each run is the real ``StreamingService.run()`` loop (subscribed to a Mosquitto the
bench starts, which sends nothing) draining a journal of N IoT events that is already
on disk (``bench_service.py``'s stream: msgpack batches of 1000 events), from a fresh
checkpoint: decode, repeated ids, engine, output file, a checkpoint every second and,
when on, the snapshot for the HTTP side every 0.5 s. Timed from the start of the loop
to the last event taken in; runs alternate off/on so that a machine's load drifting
hits both. The engine's work is the same in both: the figure is the service's.

    python3 bench/bench_http.py [--events N] [--repeat K]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import free_port, wait_port  # noqa: E402
from bench_paths import QUERIES, generate  # noqa: E402 - the same stream

TARGET = 0.95


def scraper(base: str, stop: threading.Event, scrapes: list) -> None:
    """GET /metrics and /status once a second until ``stop``."""
    while not stop.wait(1.0):
        for path in ("metrics", "status"):
            try:
                with urllib.request.urlopen(base + path, timeout=5) as r:
                    r.read()
                scrapes.append(path)
            except OSError:
                pass


def one_run(tmp: Path, journal: Path, broker: int, events: int, http: bool) -> tuple:
    """(events/s, scrapes answered) of one service draining the journal."""
    from dqcep.service import ServiceConfig, StreamingService
    from dqcep.service.http import HttpAccess

    state = tmp / ("on" if http else "off")
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir()
    shutil.copytree(journal, state / "journal")
    port = free_port()
    svc = StreamingService(ServiceConfig(
        queries=str(QUERIES), inputs=[f"mqtt://127.0.0.1:{broker}/bench-http"],
        journal=str(state / "journal"), checkpoint=str(state / "checkpoint.bin"),
        output=str(state / "matches.jsonl"), dead_letter=str(state / "dead.jsonl"),
        late=str(state / "late.jsonl"), client_id=f"bench-http-{port}",
        http=HttpAccess("127.0.0.1", port) if http else None))
    stop, done_scraping, scrapes = threading.Event(), threading.Event(), []
    runner = threading.Thread(target=svc.run, args=(stop,))
    started = time.perf_counter()
    runner.start()
    if http:
        wait_port(port)
        threading.Thread(target=scraper, args=(f"http://127.0.0.1:{port}/", done_scraping,
                                               scrapes), daemon=True).start()
    while svc.counts["events_in"] < events:
        time.sleep(0.002)
    elapsed = time.perf_counter() - started
    done_scraping.set()
    stop.set()
    runner.join(60)
    return events / elapsed, len(scrapes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=3_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from dqcep.io.journal import Journal

    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        broker = free_port()
        (tmp / "m.conf").write_text(f"listener {broker} 127.0.0.1\nallow_anonymous true\n")
        proc = subprocess.Popen([binary, "-c", str(tmp / "m.conf")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(broker)
            events = tmp / "iot.msgpack"
            generate(events, args.events)
            journal = Journal(tmp / "journal", fsync="never")
            n = 0
            with open(events, "rb") as f:
                for obj in msgpack.Unpacker(f, raw=False):
                    journal.append("sensors", msgpack.packb(obj))
                    n += len(obj["events"])
            journal.commit()
            journal.close()
            off, on, scraped = [], [], 0
            for _ in range(args.repeat):
                off.append(one_run(tmp, tmp / "journal", broker, n, False)[0])
                rate, k = one_run(tmp, tmp / "journal", broker, n, True)
                on.append(rate)
                scraped += k
        finally:
            proc.terminate()
            proc.wait(10)
    ratio = statistics.median(on) / statistics.median(off)
    print(f"events={n:,} runs={args.repeat} each (alternating)")
    print("--http off  " + "  ".join(f"{r:>11,.0f}" for r in off)
          + f"   median {statistics.median(off):,.0f} events/s")
    print("--http on   " + "  ".join(f"{r:>11,.0f}" for r in on)
          + f"   median {statistics.median(on):,.0f} events/s ({scraped} scrapes answered)")
    print(f"on / off: {ratio:.3f}x (target >= {TARGET}x)")


if __name__ == "__main__":
    main()
