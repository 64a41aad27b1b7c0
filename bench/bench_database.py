"""Matches into a database table (issue 20, the Insert operator): matches/s into
SQLite (``--output sqlite:///FILE.db``) and PostgreSQL (``--output
postgresql://...``, rows sent with COPY), one transaction per engine batch, against
the JSON-lines file output, the same matches.

The matches are found first (the SASE engine's `same_price2` on
examples/sase-stock.toml: ~0.55 matches per event), then written batch by batch
as ``dqcep run`` writes them; only the writing is timed.

    python3 bench/bench_database.py                   # 10^6 events
    python3 bench/bench_database.py --events 300000
    python3 bench/bench_database.py --postgresql postgresql://USER@HOST:PORT/DB

Without --postgresql a server of its own is started in a temporary directory
(tests/support/postgres.py: initdb + pg_ctl on a free loopback port, as the tests do).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@contextlib.contextmanager
def postgresql(url: str | None):
    """The URL given, or a fresh database on a server of our own."""
    if url:
        yield url
        return
    sys.path.insert(0, str(ROOT))
    from tests.support.postgres import PostgresServer
    with PostgresServer() as server:
        yield server.new_database()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=lambda s: int(float(s)), default=1_000_000)
    ap.add_argument("--postgresql", metavar="URL",
                    help="a database to write into (default: a server of our own)")
    args = ap.parse_args(argv)
    from dqcep.generator import generate
    from dqcep.generator.config import load_scenario
    from dqcep.io.database import PostgresMatchSink, SqliteMatchSink
    from dqcep.io.sinks import FileMatchSink
    from dqcep.lang import parse_file
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine

    queries = [q for q in parse_file(EXAMPLES / "sase-stock.cep").queries
               if q.name == "same_price2"]
    engine = Engine(build_plan(queries))
    stream = generate(load_scenario(str(EXAMPLES / "sase-stock.toml"),
                                    {"events": args.events}), 65_536)
    batches = [engine.process(b) for b in stream] + [engine.flush()]
    n = sum(len(b) for b in batches)
    rates = {}
    with tempfile.TemporaryDirectory() as tmp, postgresql(args.postgresql) as pg:
        for name, sink in (("sqlite", lambda: SqliteMatchSink(f"sqlite:///{tmp}/m.db")),
                           ("postgresql", lambda: PostgresMatchSink(pg)),
                           ("jsonl file", lambda: FileMatchSink(f"{tmp}/m.jsonl"))):
            out = sink()
            started = time.perf_counter()
            for b in batches:
                out.write_batch(b)
            out.close()
            rates[name] = n / (time.perf_counter() - started)
            print(f"{name:<11} {n:>10,} matches in {len(batches)} transactions/batches: "
                  f"{rates[name]:>12,.0f} matches/s", flush=True)
    print(f"sqlite / file: {rates['sqlite'] / rates['jsonl file']:.3f}x, postgresql / file: "
          f"{rates['postgresql'] / rates['jsonl file']:.3f}x; target >= 100,000 matches/s "
          f"into SQLite: {'met' if rates['sqlite'] >= 100_000 else 'NOT met'}")


if __name__ == "__main__":
    main()
