"""What a user's path keeps of the engine's speed: ``dqcep run`` from each format.

On one generated IoT stream (``dqcep generate --profile iot --seed 3 --plant
dqcep/data/iot.cep --plant-every 150000``) with the queries of
``dqcep/data/iot.cep``, one run measures:

- engine alone: ``Engine.process`` over ``EventColumns`` decoded beforehand,
  in chunks of 65,536, plus ``flush`` (no output);
- ``dqcep run`` from msgpack, Parquet and JSON Lines, matches written as JSON
  lines to a file: the command's wall time minus its start-up, which is the
  wall time of the same command on a 100-event file of the same format
  (reported apart);
- the split of the run path in-process: read + decode (the reader alone,
  into the engine's columns or Events), engine, match output (formatting and
  writing the matches of the whole run).

The target from the columnar-path issue: every format at >= 0.5x the engine.
Then the SASE stock stream (``dqcep generate --profile stock``) with
``SEQ(S000 a, S001 b) WHERE [price] WITHIN 5000`` (the issue's query) from
JSON Lines: >= 1 M events/s. Prices of two symbols are almost never equal, so
this measures reading and matching, not output (``[volume]`` instead gives
24 M matches from 10^6 events and measures the output).

    python3 bench/bench_paths.py [--events N]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUERIES = ROOT / "dqcep" / "data" / "iot.cep"
FORMATS = ("msgpack", "parquet", "jsonl", "csv")
CHUNK = 65_536
STOCK_QUERY = "PATTERN SEQ(S000 a, S001 b) WHERE [price] WITHIN 5000\n"


def generate(path: Path, events: int) -> None:
    subprocess.run([sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "--events",
                    str(events), "--seed", "3", "--plant", str(QUERIES), "--plant-every",
                    "150000", "--quiet", "--output", str(path)], check=True)


def wall(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def engine():
    from dqcep.lang import parse_file
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine
    return Engine(build_plan(parse_file(str(QUERIES)).queries))


def engine_run(path: Path) -> tuple[float, float, list, int]:
    """(read + decode s, engine s, the match batches, events): the file's events decoded
    into the engine's columns first, then ``Engine.process`` over them alone, and flush."""
    from dqcep.io.columnar import read_columns
    from dqcep.runtime import EventColumns

    e = engine()
    started = time.perf_counter()
    pieces = [EventColumns(*p) if isinstance(p, tuple) else p
              for p in read_columns(str(path), None, e, None, CHUNK)]
    read = time.perf_counter() - started
    started = time.perf_counter()
    batches = [e.process(p) for p in pieces] + [e.flush()]
    return read, time.perf_counter() - started, batches, e.events_in


def split(path: Path, out: Path) -> tuple[float, float, float, int]:
    """(read + decode s, engine s, output s, events) of the run path, in-process."""
    from dqcep.io.sinks import open_match_sink

    read, run, batches, events = engine_run(path)
    sink = open_match_sink(str(out))
    started = time.perf_counter()
    for b in batches:
        sink.write_batch(b)
    sink.close()
    return read, run, time.perf_counter() - started, events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for fmt in FORMATS:
            generate(tmp / f"iot.{fmt}", args.events)
            generate(tmp / f"small.{fmt}", 100)

        # the engine alone, on columns decoded beforehand
        from dqcep.io.columnar import read_columns
        from dqcep.runtime import EventColumns
        e = engine()
        pieces = [EventColumns(*p) for p in read_columns(str(tmp / "iot.msgpack"), None,
                                                         e, None, CHUNK)]
        n = sum(len(p.ts) for p in pieces)
        started = time.perf_counter()
        matches = sum(len(e.process(p)) for p in pieces) + len(e.flush())
        alone = n / (time.perf_counter() - started)
        print(f"events={n:,} queries=iot.cep matches={matches:,} chunk={CHUNK}")
        print(f"{'path':<28} {'events/s':>12} {'x engine':>9} {'start-up s':>11} "
              f"{'read s':>8} {'engine s':>9} {'output s':>9}")
        print(f"{'engine alone':<28} {alone:>12,.0f} {1:>9.2f}")
        worst = None
        for fmt in FORMATS:
            run = [sys.executable, "-m", "dqcep", "run", str(QUERIES), "--input"]
            startup = wall(run + [str(tmp / f"small.{fmt}"), "-o", str(tmp / "s.jsonl")])
            took = wall(run + [str(tmp / f"iot.{fmt}"), "-o", str(tmp / "m.jsonl")])
            rate = n / max(took - startup, 1e-9)
            read, eng, out, _ = split(tmp / f"iot.{fmt}", tmp / "m2.jsonl")
            worst = rate / alone if worst is None else min(worst, rate / alone)
            print(f"{'dqcep run from ' + fmt:<28} {rate:>12,.0f} {rate / alone:>9.2f} "
                  f"{startup:>11.2f} {read:>8.2f} {eng:>9.2f} {out:>9.2f}")
        print(f"target: every format >= 0.5x the engine alone; worst {worst:.2f}x")

        # the SASE stock stream over JSON Lines
        stock, query = tmp / "stock.jsonl", tmp / "stock.cep"
        query.write_text(STOCK_QUERY)
        for path, n_events in ((stock, args.events), (tmp / "small-stock.jsonl", 100)):
            subprocess.run([sys.executable, "-m", "dqcep", "generate", "--profile", "stock",
                            "--events", str(n_events), "--seed", "3", "--quiet", "--output",
                            str(path)], check=True)
        run = [sys.executable, "-m", "dqcep", "run", str(query), "--input"]
        startup = wall(run + [str(tmp / "small-stock.jsonl"), "-o", str(tmp / "s.jsonl")])
        took = wall(run + [str(stock), "-o", str(tmp / "m.jsonl")])
        rate = args.events / max(took - startup, 1e-9)
        matches = len((tmp / "m.jsonl").read_bytes().splitlines())
        print(f"stock: {STOCK_QUERY.strip()} -> {matches:,} matches")
        print(f"{'dqcep run from jsonl':<28} {rate:>12,.0f} events/s (target >= 1,000,000); "
              f"start-up {startup:.2f} s")


if __name__ == "__main__":
    main()
