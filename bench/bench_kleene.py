"""Kleene items on the native engine against the reference matcher (spec 5.1).

On one generated IoT stream (``dqcep generate --profile iot --seed 3``) the
query below (a rising run of at least three temperature readings in a room,
then smoke, within 5 s; skip-till-any-match, so every rising sub-list counts)
runs on the reference matcher and on the native engine (``Engine.process`` over
the events in chunks, then ``flush``; no output), on N events and, for the
native engine only, on 10 N. It prints each engine's events/s, the matches (the
same set on both), the lists the KLEENE vertex made and the engine's peak state.

    python3 bench/bench_kleene.py [--events N]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUERY = """QUERY rising
PATTERN SEQ(Temperature+ t[], Smoke s)
WHERE [room] AND t[i].value > t[i-1].value AND count(t) >= 3 AND s.density > 0.5
WITHIN 5 s
"""
CHUNK = 10_000


def events_of(n: int, tmp: Path) -> list:
    from dqcep.io.readers import read_events
    path = tmp / f"iot-{n}.jsonl"
    subprocess.run([sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n", str(n),
                    "--seed", "3", "--quiet", "-o", str(path)], check=True)
    return [e for _, e in read_events(str(path))]


def native(queries, events) -> tuple[float, set, int, int]:
    from dqcep.plan import Kind, build_plan
    from dqcep.runtime import Engine
    engine = Engine(build_plan(queries))
    started = time.perf_counter()
    out = engine.process(events[:0])
    for i in range(0, len(events), CHUNK):
        out += engine.process(events[i:i + CHUNK])
    out += engine.flush()
    seconds = time.perf_counter() - started
    kleene = [v for v in range(engine.plan.n_vertices) if engine.plan.kind(v) == Kind.KLEENE]
    lists = sum(engine.state.stats[v].outputs for v in kleene)
    matches = {(m.query, m.events) for m in out.to_matches()}
    return seconds, matches, lists, engine.state.peak_state_bytes


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20_000)
    args = ap.parse_args(argv)
    from dqcep.lang import parse
    from dqcep.baseline.reference import ReferenceMatcher
    queries = parse(QUERY).queries
    n = args.events
    with tempfile.TemporaryDirectory() as tmp:
        small, large = events_of(n, Path(tmp)), events_of(10 * n, Path(tmp))
    started = time.perf_counter()
    expected = {(m.query, m.events) for m in ReferenceMatcher(queries).run(small)}
    ref_s = time.perf_counter() - started
    nat_s, got, lists, peak = native(queries, small)
    big_s, big, big_lists, big_peak = native(queries, large)
    print("query: rising temperature run (>= 3, skip-till-any-match) then smoke, WITHIN 5 s; "
          "iot --seed 3")
    print(f"{'run':<28} {'events':>10} {'seconds':>8} {'events/s':>11} {'matches':>8} "
          f"{'lists out':>10} {'peak state':>11}")
    print(f"{'reference':<28} {n:>10,} {ref_s:>8.2f} {n / ref_s:>11,.0f} {len(expected):>8,}")
    print(f"{'native':<28} {n:>10,} {nat_s:>8.2f} {n / nat_s:>11,.0f} {len(got):>8,} "
          f"{lists:>10,} {peak / 1e6:>9.2f} MB")
    print(f"{'native':<28} {10 * n:>10,} {big_s:>8.2f} {10 * n / big_s:>11,.0f} {len(big):>8,} "
          f"{big_lists:>10,} {big_peak / 1e6:>9.2f} MB")
    print(f"native / reference on {n:,} events: {ref_s / nat_s:.0f}x; same matches: "
          f"{got == expected}")


if __name__ == "__main__":
    main()
