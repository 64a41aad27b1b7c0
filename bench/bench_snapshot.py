"""Snapshot and restore of the engine state at steady state, W1 and W4.

Runs a workload of ``bench_engine.py`` (uniform profile, 100 keys, window
~1000 events) for N events, then times ``Engine.snapshot()`` and
``restore()`` into a fresh engine built from the same plan (best of 20 each):
bytes, ms, ms per MB. The columnar-path issue's target: a 1 MB state restored
in well under 10 ms, nothing recompiled (the restore into a fresh engine
here includes no planning; building the engine is timed apart).

    python3 bench/bench_snapshot.py [--events N]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import WORKLOADS, stream  # noqa: E402 - the same workloads


def best(f, repeat: int = 20) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        f()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    args = ap.parse_args()
    from dqcep.lang import parse
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine

    print(f"{'workload':<9} {'state MB':>9} {'snapshot ms':>12} {'restore ms':>11} "
          f"{'ms/MB snap':>11} {'ms/MB rest':>11} {'new engine ms':>14}")
    for name in ("W1", "W4"):
        types, text = WORKLOADS[name]
        plan = build_plan(parse(text).queries)
        engine = Engine(plan)
        for batch in stream(types, args.events):
            engine.process(batch)
        blob = engine.snapshot()
        mb = len(blob) / 1e6
        snap = best(engine.snapshot)
        fresh = best(lambda: Engine(plan), 5)
        engines = [Engine(plan) for _ in range(20)]
        rest = best(lambda: engines.pop().restore(blob))
        print(f"{name:<9} {mb:>9.2f} {snap * 1e3:>12.2f} {rest * 1e3:>11.2f} "
              f"{snap * 1e3 / mb:>11.2f} {rest * 1e3 / mb:>11.2f} {fresh * 1e3:>14.2f}")


if __name__ == "__main__":
    main()
