"""Lookups (issue 20, the Select operator): the IoT workload with a threshold per room
read from a lookup table, against the same queries with the threshold written as a
constant, on the native engine; the table in SQLite and in PostgreSQL.

dqcep/data/iot.cep's ``overheating`` reads ``t.value > 35``; here the lookup version
reads ``t.value > rooms(t.room).threshold`` from a table where every room's threshold
is 35, so both find the same matches (checked). Each run reads the stream's columns
once, then times the engine over 65,536-event batches, with the tables' refresh
before each batch as ``dqcep run`` does it (so a due re-read is timed too). Round
trips are the table reads (one SELECT each); SQLite's change check before a batch
is local (``PRAGMA data_version``) and counted apart. ``--refresh 0`` reads the
table before every batch: the worst case.

    python3 bench/bench_lookups.py                 # 10^6 events, REFRESH default (10 s)
    python3 bench/bench_lookups.py --refresh 0
"""
from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_database import postgresql  # noqa: E402 - a server of its own
from bench_paths import QUERIES, generate  # noqa: E402 - the same stream

ROOMS = [f"site{s}/room{r}" for s in (1, 2) for r in range(1, 6)]
TARGET = 0.5


def run(text: str, events: Path, tables) -> tuple[float, int, int, int]:
    """(events/s, matches, table reads, batches) of the native engine over the stream's
    columns (read first, untimed, by the same engine: string codes are its own)."""
    from dqcep.io.columnar import read_columns
    from dqcep.lang import parse
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine, EventColumns
    parsed = parse(text)
    engine = Engine(build_plan(parsed.queries, tables=parsed.tables), lookup_source=tables)
    pieces = [EventColumns(*p) for p in read_columns(str(events), None, engine)]
    reads = tables.reads if tables is not None else 0
    n = matches = 0
    started = time.perf_counter()
    for p in pieces:
        if tables is not None:
            tables.refresh()
        matches += len(engine.process(p))
        n += len(p.ts)
    matches += len(engine.flush())
    seconds = time.perf_counter() - started
    return n / seconds, matches, (tables.reads - reads if tables is not None else 0), \
        len(pieces)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=lambda s: int(float(s)), default=1_000_000)
    ap.add_argument("--refresh", type=int, default=None, metavar="MS",
                    help="the tables' REFRESH (default: the language's default)")
    ap.add_argument("--postgresql", metavar="URL", help="a database to use (default: a "
                    "server of our own)")
    args = ap.parse_args()
    from dqcep.io.database import DatabaseTables, postgres_target
    from dqcep.lang import parse

    constant = QUERIES.read_text()
    assert constant.count("t.value > 35") == 1
    refresh = "" if args.refresh is None else f" REFRESH {args.refresh} ms"
    with tempfile.TemporaryDirectory() as tmp, postgresql(args.postgresql) as pg:
        tmp = Path(tmp)
        events = tmp / "iot.msgpack"
        generate(events, args.events)
        rows = [(room, 35.0) for room in ROOMS]
        with sqlite3.connect(tmp / "rooms.db") as db:
            db.execute("CREATE TABLE rooms (room TEXT PRIMARY KEY, threshold REAL)")
            db.executemany("INSERT INTO rooms VALUES (?, ?)", rows)
        import psycopg
        with psycopg.connect(**postgres_target(pg)[0], autocommit=True) as db:
            db.execute("CREATE TABLE rooms (room TEXT PRIMARY KEY, threshold DOUBLE PRECISION)")
            with db.cursor() as cur:
                cur.executemany("INSERT INTO rooms VALUES (%s, %s)", rows)

        base, base_matches, _, batches = run(constant, events, None)
        print(f"events={args.events:,} batches={batches} matches={base_matches:,}")
        print(f"constant threshold     {base:>12,.0f} events/s")
        for name, url in (("sqlite", f"sqlite:///{tmp}/rooms.db"), ("postgresql", pg)):
            text = (f"TABLE rooms(room STRING, threshold DOUBLE) KEY room FROM '{url}'"
                    f"{refresh};\n" + constant.replace(
                        "t.value > 35", "t.value > rooms(t.room).threshold"))
            tables = DatabaseTables(parse(text).tables)
            rate, matches, reads, _ = run(text, events, tables)
            tables.close()
            assert matches == base_matches, (name, matches, base_matches)
            per = (reads + 1) * 1_000_000 / args.events  # + the read at the start
            print(f"lookup from {name:<10} {rate:>12,.0f} events/s  ({rate / base:.2f}x the "
                  f"constant; {reads + 1} table read(s) = {per:,.1f} round trips per 10^6 "
                  f"events{', plus a local change check per batch' if name == 'sqlite' else ''})")
            print(f"  target >= {TARGET}x: {'met' if rate / base >= TARGET else 'NOT met'}")


if __name__ == "__main__":
    main()
