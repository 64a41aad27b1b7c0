"""The streaming job's micro-batch time against the number of keys its state holds.

A journal of closed segments, one per micro-batch (``dqcep spark stream`` reads one
closed segment per micro-batch): first one segment that leaves ``--held`` partial
matches held for each of K keys (rooms), then ``--batches`` segments of ``--events``
events each that touch only 10 of those keys. Printed: Spark's ``durationMs`` of each of those
micro-batches (``triggerExecution``; its ``addBatch`` part is the state work), for
K = 10 and K = 10,000 (``--keys``). A job whose micro-batch costs time in proportion
to its events and the state it touches gives the same figures for both.

    python3 bench/bench_stream.py [--keys 10 10000] [--events 10000] [--batches 5] [--held 10]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

QUERY = """QUERY hot
PATTERN SEQ(Temperature t, Smoke s)
WHERE [room] AND t.value > 40
WITHIN 1 h
"""
TOUCHED = 10  # keys the timed micro-batches touch


def journal(path: Path, keys: int, events: int, batches: int, held: int) -> None:
    """One segment leaving ``held`` partial matches (Temperature readings above 40) held
    for each of ``keys`` rooms, then ``batches`` segments of ``events`` Smoke events over
    the first TOUCHED rooms (each completes the held matches of its room; a Smoke is not
    kept, so the state the store holds stays as it was)."""
    import msgpack

    from dqcep.io.journal import Journal
    j = Journal(path, segment_bytes=1, fsync="never")  # every commit closes its segment
    ids, ts = iter(range(1, 10 ** 9)), 0

    def segment(evs):
        j.append("t", msgpack.packb({"events": evs}))
        j.commit()

    ts = 0
    for h in range(held):
        evs = []
        for k in range(keys):
            ts += 1
            evs.append({"id": next(ids), "type": "Temperature", "ts": ts, "room": f"r{k}",
                        "value": 45.0})
        if h == held - 1:
            segment(evs)
        else:
            j.append("t", msgpack.packb({"events": evs}))  # one segment for all
    for _ in range(batches):
        evs = []
        for i in range(events):
            ts += 1
            evs.append({"id": next(ids), "type": "Smoke", "ts": ts, "room": f"r{i % TOUCHED}"})
        segment(evs)
    j.close()


def child(args) -> None:
    """One run in this process: prints the micro-batches' progress as JSON."""
    from dqcep.spark.session import spark_session
    from dqcep.spark.stream import run_stream
    tmp = Path(args.dir)
    journal(tmp / "journal", args.keys[0], args.events, args.batches, args.held)
    # the key partitions (--partitions) apart from Spark's shuffle partitions (2: notes)
    spark = spark_session(args.master, "dqcep-bench-stream", 2)
    try:
        query = run_stream(spark, QUERY, str(tmp / "journal"), str(tmp / "out"),
                           str(tmp / "ck"), partitions=args.partitions, until_idle=True,
                           trigger_seconds=0.2)
        progress = [{"rows": _field(p, "numInputRows"), "ms": dict(_field(p, "durationMs"))}
                    for p in query.recentProgress if _field(p, "numInputRows")]
    finally:
        spark.stop()
    print(json.dumps(progress))


def _field(progress, name: str):
    """A field of a query progress (an object in PySpark 4, a dict before)."""
    return getattr(progress, name) if hasattr(progress, name) else progress[name]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, nargs="+", default=[10, 10_000])
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--held", type=int, default=10, help="partial matches held per key")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    print(f"dqcep spark stream, {args.master}, --partitions {args.partitions}: micro-batches "
          f"of {args.events:,} events touching {TOUCHED} keys, after one that leaves "
          f"{args.held} partial matches held for each of K keys")
    print(f"{'K keys held':>12} {'batch':>6} {'rows':>7} {'trigger ms':>11} {'addBatch ms':>12}")
    for keys in args.keys:
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run(
                [sys.executable, __file__, "--child", "--dir", tmp, "--keys", str(keys),
                 "--events", str(args.events), "--batches", str(args.batches), "--held",
                 str(args.held), "--master",
                 args.master, "--partitions", str(args.partitions)],
                capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(proc.stderr[-4000:])
            progress = json.loads(proc.stdout.strip().splitlines()[-1])
        for i, p in enumerate(progress):
            print(f"{keys:>12,} {i:>6} {p['rows']:>7,} {p['ms'].get('triggerExecution', 0):>11,}"
                  f" {p['ms'].get('addBatch', 0):>12,}")


if __name__ == "__main__":
    main()
