"""Materialized or built on demand (issue 19): each query with every join's records
kept (``always``) and with them built on demand wherever the planner can
(``on-demand``), engine alone, one process, a fresh engine per point.

Queries: the experiments' uniform and iot workloads, one by one. (The SASE Java
engine's stock workloads are not here yet: on the generator's stock profile, with
float prices, they find no match.)

For each point: events/s, matches, peak engine state and the vertices built on
demand; then on-demand / always for both.

    python3 bench/bench_materialize.py                 # 10^6 events per point
    python3 bench/bench_materialize.py --events 300000
"""
from __future__ import annotations

import argparse
import time

MODES = ("always", "on-demand")


def points():
    from dqcep.experiments.workloads import WORKLOADS
    from dqcep.lang import parse
    for name in ("uniform", "iot"):
        w = WORKLOADS[name]
        for q in parse(w.queries).queries:
            yield f"{name} {q.name}", [q], w.stream


def run(queries, stream, events: int, mode: str) -> dict:
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine
    engine = Engine(build_plan(queries, materialize=mode))
    busy, matches = 0.0, 0
    for batch in stream(events, 1, 65_536):
        started = time.perf_counter()
        matches += len(engine.process(batch))
        busy += time.perf_counter() - started
    started = time.perf_counter()
    matches += len(engine.flush())
    busy += time.perf_counter() - started
    return {"events_per_s": events / busy, "matches": matches,
            "state": engine.peak_state_bytes, "on_demand": sum(engine.plan.on_demand)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=lambda s: int(float(s)), default=1_000_000)
    args = ap.parse_args(argv)
    print(f"{'query':<22} {'records':<10} {'events/s':>12} {'matches':>11} {'peak state':>11} "
          f"{'on demand':>9}")
    for name, queries, stream in points():
        r = {}
        for mode in MODES:
            r[mode] = run(queries, stream, args.events, mode)
            x = r[mode]
            print(f"{name:<22} {mode:<10} {x['events_per_s']:>12,.0f} {x['matches']:>11,} "
                  f"{x['state'] / 1e6:>8.2f} MB {x['on_demand']:>9}", flush=True)
        a, b = r["on-demand"], r["always"]
        same = "same matches" if a["matches"] == b["matches"] else "MATCHES DIFFER"
        print(f"{name:<22} on-demand / always: events/s "
              f"{a['events_per_s'] / b['events_per_s']:.2f}x, state "
              f"{a['state'] / b['state']:.2f}x ({same})", flush=True)


if __name__ == "__main__":
    main()
