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

``--queries N`` runs N copies of the IoT queries (each under a name of its own, so
that each has its own series): the scrape's cost with a large query set (issue 49
item 14: 1,000 queries, 1.1 MB a scrape, 0.78x). It prints the size of the last
/metrics and /status answers and the time a scrape took.

    python3 bench/bench_http.py [--events N] [--repeat K] [--queries N]
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
    """GET /metrics and /status once a second until ``stop``: (path, bytes, seconds)."""
    while not stop.wait(1.0):
        for path in ("metrics", "status"):
            try:
                started = time.perf_counter()
                with urllib.request.urlopen(base + path, timeout=30) as r:
                    size = len(r.read())
                scrapes.append((path, size, time.perf_counter() - started))
            except OSError:
                pass


def query_file(tmp: Path, copies: int) -> Path:
    """The IoT queries, ``copies`` times, each copy's queries named ``NAME_k``."""
    import dataclasses
    from dqcep.lang import parse_file
    from dqcep.lang.printer import file_to_source
    qf = parse_file(str(QUERIES))
    queries = tuple(dataclasses.replace(q, name=f"{q.name}_{k}")
                    for k in range(copies) for q in qf.queries)
    path = tmp / f"queries-{copies}.cep"
    path.write_text(file_to_source(dataclasses.replace(qf, queries=queries)))
    return path


def one_run(tmp: Path, journal: Path, broker: int, events: int, http: bool,
            queries: Path = QUERIES) -> tuple:
    """(events/s, scrapes answered) of one service draining the journal."""
    from dqcep.service import ServiceConfig, StreamingService
    from dqcep.service.http import HttpAccess

    state = tmp / ("on" if http else "off")
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir()
    shutil.copytree(journal, state / "journal")
    port = free_port()
    svc = StreamingService(ServiceConfig(
        queries=str(queries), inputs=[f"mqtt://127.0.0.1:{broker}/bench-http"],
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
    return events / elapsed, scrapes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=3_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--queries", type=int, default=1, metavar="N",
                    help="copies of the IoT queries (default 1: its 3 queries)")
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
            queries = query_file(tmp, args.queries) if args.queries > 1 else QUERIES
            off, on, scraped = [], [], []
            for _ in range(args.repeat):
                off.append(one_run(tmp, tmp / "journal", broker, n, False, queries)[0])
                rate, k = one_run(tmp, tmp / "journal", broker, n, True, queries)
                on.append(rate)
                scraped += k
        finally:
            proc.terminate()
            proc.wait(10)
    ratio = statistics.median(on) / statistics.median(off)
    print(f"events={n:,} queries={3 * args.queries:,} runs={args.repeat} each (alternating)")
    print("--http off  " + "  ".join(f"{r:>11,.0f}" for r in off)
          + f"   median {statistics.median(off):,.0f} events/s")
    print("--http on   " + "  ".join(f"{r:>11,.0f}" for r in on)
          + f"   median {statistics.median(on):,.0f} events/s ({len(scraped)} scrapes answered)")
    for path in ("metrics", "status"):
        got = [(size, secs) for p, size, secs in scraped if p == path]
        if got:
            print(f"/{path}: {got[-1][0]:,} bytes, median {statistics.median(s for _, s in got) * 1000:,.1f} ms a request")
    print(f"on / off: {ratio:.3f}x (target >= {TARGET}x)")


if __name__ == "__main__":
    main()
