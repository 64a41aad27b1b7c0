"""Materialized or built on demand (issue 19): each query with every join's records
kept (``always``) and with them built on demand wherever the planner can
(``on-demand``), engine alone, one process, a fresh engine per point.

Queries, one by one: the experiments' uniform and iot workloads, and the SASE
Java engine's stock workloads (examples/sase-stock.cep on the stream of
examples/sase-stock.toml: three symbols, 1000 ticks/s, integer prices 1..1000).

For each point: events/s, matches, peak engine state and the vertices built on
demand, with the SASE baseline (``dqcep.baseline``) on the same stream for
scale (the fastest of ``--repeats`` alternating runs); then on-demand / always
for both.

    python3 bench/bench_materialize.py                 # 10^6 events per point
    python3 bench/bench_materialize.py --events 300000
"""
from __future__ import annotations

import argparse

from pathlib import Path

MODES = ("always", "on-demand", "sase")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def points():
    from dqcep.experiments.workloads import WORKLOADS
    from dqcep.lang import parse, parse_file
    for name in ("uniform", "iot"):
        w = WORKLOADS[name]
        for q in parse(w.queries).queries:
            yield f"{name} {q.name}", [q], w.stream
    for q in parse_file(EXAMPLES / "sase-stock.cep").queries:
        yield f"stock {q.name}", [q], stock_stream


def stock_stream(events: int, seed: int, chunk: int):
    from dqcep.generator import generate
    from dqcep.generator.config import load_scenario
    return generate(load_scenario(str(EXAMPLES / "sase-stock.toml"),
                                  {"events": events, "seed": seed}), chunk)


def run(queries, stream, events: int, mode: str) -> dict:
    from dqcep.baseline import SaseEngine
    from dqcep.experiments.point import feed
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine
    engine = SaseEngine(queries) if mode == "sase" else \
        Engine(build_plan(queries, materialize=mode))
    busy, matches, state = feed([engine], stream(events, 1, 65_536))
    return {"events_per_s": events / busy, "matches": matches, "state": state,
            "on_demand": sum(engine.plan.on_demand) if mode != "sase" else "-"}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=lambda s: int(float(s)), default=1_000_000)
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs per mode, alternating; the fastest counts (default 2)")
    args = ap.parse_args(argv)
    print(f"{'query':<22} {'records':<10} {'events/s':>12} {'matches':>11} {'peak state':>11} "
          f"{'on demand':>9}")
    for name, queries, stream in points():
        r = {}
        for _ in range(args.repeats):  # alternating: neither mode always runs first
            for mode in MODES:
                x = run(queries, stream, args.events, mode)
                if mode not in r or x["events_per_s"] > r[mode]["events_per_s"]:
                    r[mode] = x
        for mode in MODES:
            x = r[mode]
            print(f"{name:<22} {mode:<10} {x['events_per_s']:>12,.0f} {x['matches']:>11,} "
                  f"{x['state'] / 1e6:>8.2f} MB {x['on_demand']:>9}", flush=True)
        a, b = r["on-demand"], r["always"]
        same = "same matches" if len({x["matches"] for x in r.values()}) == 1 \
            else "MATCHES DIFFER"
        print(f"{name:<22} on-demand / always: events/s "
              f"{a['events_per_s'] / b['events_per_s']:.2f}x, state "
              f"{a['state'] / b['state']:.2f}x ({same})", flush=True)


if __name__ == "__main__":
    main()
