"""Native engine benchmarks W1-W4 (issue: native runtime), one command, one table.

Each (workload, size) point runs in a fresh Python process pinned to one core,
so its peak RSS is its own. The stream comes from ``generator`` (uniform
profile, 1000 events/s of event time, 100 keys) as columnar batches; only the
engine's work is timed (``process`` + ``flush``), not generating the events.
Each native point is run ``--repeat`` times in that process, a fresh engine each
time, and the best time is reported (the first run also pays for the engine's
memory growth). The reference matcher runs at the smallest size only.

    python3 bench/bench_engine.py                       # the full table (10^5..10^7)
    python3 bench/bench_engine.py --sizes 100000 --workloads W1,W4
    python3 bench/bench_engine.py --adapt      # adapting from always
    python3 bench/bench_engine.py --adapt --materialize auto   # dqcep run on a file
    python3 bench/bench_engine.py --workloads W4 --materialize chain

``--materialize``: the native plans (default ``always``, as the service; ``auto`` gets
the stream's rates). ``--adapt``: each native engine is what ``dqcep run`` runs on a
file (``AdaptiveEngine``, moving queries between joins and a chain as it measures
them), starting from those plans, not a bare ``Engine``.

Workloads (window ~1000 events, 100 keys):
  W1  SEQ(T0 a, T1 b) WHERE [key] WITHIN 1 s
  W2  SEQ(T0 a, T1 b, T2 c) WHERE [key] AND a.a0 < b.a0 WITHIN 1 s
  W3  SEQ(T0 a, NOT T3 n, AND(T1 b, OR(T2 c, T4 d))) WHERE [key] WITHIN 1 s
  W4  50 queries SEQ(T0 a, T1 b, Tk c) WHERE [key] AND c.a0 < t_i, sharing
      SEQ(T0, T1); run as one shared plan and as 50 separate engines
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

WORKLOADS = {
    "W1": (2, "QUERY w1 PATTERN SEQ(T0 a, T1 b) WHERE [key] WITHIN 1 s"),
    "W2": (3, "QUERY w2 PATTERN SEQ(T0 a, T1 b, T2 c) WHERE [key] AND a.a0 < b.a0 WITHIN 1 s"),
    "W3": (5, "QUERY w3 PATTERN SEQ(T0 a, NOT T3 n, AND(T1 b, OR(T2 c, T4 d))) "
              "WHERE [key] WITHIN 1 s"),
    "W4": (10, ";\n".join(f"QUERY w4_{i} PATTERN SEQ(T0 a, T1 b, T{2 + i % 8} c) "
                          f"WHERE [key] AND c.a0 < {100 + 18 * i} WITHIN 1 s"
                          for i in range(50))),
}
CHUNK = 65_536


def stream(types: int, events: int):
    from dqcep.generator import GeneratorConfig, UniformConfig, generate
    cfg = GeneratorConfig(profile="uniform", events=events, seed=1, profile_config=UniformConfig(
        types=types, keys=100, attributes=1, domain=1000, event_rate=1000))
    return generate(cfg, CHUNK)


def run_native(make, types: int, events: int) -> tuple[float, int, int]:
    """(seconds in the engines, matches, peak state bytes) over one stream; ``make``
    gives fresh engines."""
    from dqcep.experiments.point import feed

    return feed(make(), stream(types, events))


def point(workload: str, events: int, mode: str, repeat: int) -> dict:
    from dqcep.lang import parse
    from dqcep.plan import Kind, build_plan

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    types, text = WORKLOADS[workload]
    queries = parse(text).queries
    if mode == "reference":
        from dqcep.baseline.reference import ReferenceMatcher
        events_list = [e for b in stream(types, events) for e in b.to_events()]
        t0 = time.perf_counter()
        n = len(ReferenceMatcher(queries).run(events_list))
        busy, state = time.perf_counter() - t0, 0
    else:
        from dqcep.runtime import Engine
        groups = [queries] if mode.startswith("shared") else [[q] for q in queries]
        rates = {f"T{i}": 1000 / types for i in range(types)}
        materialize = mode.split(":")[-1]  # MODE[+adapt]:MATERIALIZE
        # the stream's rates where the cost model chooses (auto); the other modes plan
        # as before rates were given (the figures in bench/README.md)
        plans = [build_plan(g, rates=rates if materialize == "auto" else None,
                            materialize=materialize) for g in groups]

        def make():
            if "+adapt" in mode:
                from dqcep.runtime.adapt import AdaptiveEngine
                return [AdaptiveEngine(g, rates=rates, materialize=materialize) for g in groups]
            return [Engine(p) for p in plans]
        best = None
        for _ in range(repeat):
            busy, n, state = run_native(make, types, events)
            best = busy if best is None else min(best, busy)
        busy = best
    vertices = 0
    if mode != "reference":
        vertices = sum(sum(1 for v in range(p.n_vertices) if p.kind(v) != Kind.OUTPUT)
                       for p in plans)
    return {"workload": workload, "events": events, "mode": mode, "seconds": busy,
            "events_per_s": events / busy, "matches": n, "state_bytes": state,
            "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "vertices": vertices}


def measure(workload: str, events: int, mode: str, repeat: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--point", workload, str(events), mode,
                          str(repeat)], capture_output=True, text=True,
                         env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    if out.returncode != 0:
        raise SystemExit(f"{workload} {events} {mode} failed:\n{out.stderr}")
    return json.loads(out.stdout)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000,10000000")
    ap.add_argument("--workloads", default="W1,W2,W3,W4")
    ap.add_argument("--repeat", type=int, default=3, help="native runs per point (best kept)")
    ap.add_argument("--no-reference", action="store_true",
                    help="skip the reference matcher (it needs minutes at 10^5 events for W4)")
    ap.add_argument("--adapt", action="store_true",
                    help="native: dqcep run's engine on a file (AdaptiveEngine)")
    ap.add_argument("--materialize", default="always",
                    help="the native plans (with --adapt: the start plans)")
    ap.add_argument("--point", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.point:
        w, n, mode, repeat = args.point
        print(json.dumps(point(w, int(n), mode, int(repeat))))
        return
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    rows = []
    print(f"{'workload':8} {'events':>9} {'engine':10} {'events/s':>12} {'matches':>11} "
          f"{'state MB':>9} {'RSS MB':>8} {'vertices':>8}")
    for w in args.workloads.split(","):
        modes = ["shared", "separate"] if w == "W4" else ["shared"]
        for n in sizes:
            for mode in modes + (["reference"] if n == sizes[0] and not args.no_reference
                                 else []):
                if mode == "separate" and n > sizes[min(1, len(sizes) - 1)]:
                    continue  # 50 separate engines: two sizes are enough for the ratio
                plan = ("+adapt" if args.adapt else "") + f":{args.materialize}"
                r = measure(w, n, mode + ("" if mode == "reference" else plan),
                            1 if mode == "reference" else args.repeat)
                rows.append(r)
                r["mode"] = mode  # (without the plan)
                label = {"shared": "native", "separate": "native/50", "reference": "reference"}
                print(f"{w:8} {n:>9} {label[mode]:10} {r['events_per_s']:>12,.0f} "
                      f"{r['matches']:>11} {r['state_bytes'] / 1e6:>9.2f} "
                      f"{r['rss_bytes'] / 1e6:>8.1f} {r['vertices'] or '':>8}", flush=True)
    print()
    for w in args.workloads.split(","):
        mine = [r for r in rows if r["workload"] == w]
        ref = [r for r in mine if r["mode"] == "reference"]
        nat = [r for r in mine if r["mode"] == "shared"]
        if ref and nat:
            same = [r for r in nat if r["events"] == ref[0]["events"]][0]
            agree = "same matches" if same["matches"] == ref[0]["matches"] else "MATCH COUNTS DIFFER"
            print(f"{w}: native / reference at {ref[0]['events']:,} events: "
                  f"{same['events_per_s'] / ref[0]['events_per_s']:,.0f}x ({agree})")
        if len(nat) >= 3:
            a, b = nat[-2], nat[-1]
            print(f"{w}: engine state {a['events']:,} -> {b['events']:,} events: "
                  f"{a['state_bytes'] / 1e6:.2f} -> {b['state_bytes'] / 1e6:.2f} MB "
                  f"({(b['state_bytes'] / a['state_bytes'] - 1) * 100:+.1f}%)")
        sep = {r["events"]: r for r in mine if r["mode"] == "separate"}
        for r in nat:
            if r["events"] in sep:
                s = sep[r["events"]]
                print(f"{w}: sharing at {r['events']:,} events: {r['vertices']} vs "
                      f"{s['vertices']} vertices, {r['events_per_s'] / s['events_per_s']:.1f}x "
                      f"faster ({'same' if r['matches'] == s['matches'] else 'DIFFERENT'} "
                      f"matches)")


if __name__ == "__main__":
    main()
