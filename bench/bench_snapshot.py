"""Snapshot and restore of the engine state at steady state, W1 and W4.

Runs a workload of ``bench_engine.py`` (uniform profile, 100 keys, window
~1000 events) for N events, then times ``Engine.snapshot()`` and a key's
engine made from those bytes, ``Engine(program, state=EngineState.from_bytes(
program, blob))``, with the program compiled once as a Spark worker does (best
of 20 each): bytes, ms, ms per MB. Compiling the program (``Program(plan)``),
which a restore no longer does, is timed apart. The columnar-path issue's
target: a 1 MB state restored in well under 10 ms, nothing recompiled.

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
    from dqcep.runtime import Engine, EngineState, Program

    print(f"{'workload':<9} {'state MB':>9} {'snapshot ms':>12} {'restore ms':>11} "
          f"{'ms/MB snap':>11} {'ms/MB rest':>11} {'compile ms':>11}")
    for name in ("W1", "W4"):
        types, text = WORKLOADS[name]
        plan = build_plan(parse(text).queries)
        program = Program(plan)  # compiled once, as a Spark worker does (program_for)
        engine = Engine(program)
        for batch in stream(types, args.events):
            engine.process(batch)
        blob = engine.snapshot()
        mb = len(blob) / 1e6
        snap = best(engine.snapshot)
        compile_ = best(lambda: Program(plan), 5)
        # a key's engine from its bytes: state restored, nothing compiled
        rest = best(lambda: Engine(program, state=EngineState.from_bytes(program, blob)))
        print(f"{name:<9} {mb:>9.2f} {snap * 1e3:>12.2f} {rest * 1e3:>11.2f} "
              f"{snap * 1e3 / mb:>11.2f} {rest * 1e3 / mb:>11.2f} {compile_ * 1e3:>11.2f}")


if __name__ == "__main__":
    main()
