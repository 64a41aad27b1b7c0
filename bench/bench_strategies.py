"""Selection strategies and Kleene runs: the native engine against the SASE baseline
(issue 18: K1, K2, S1).

Only the engine's work is timed (``process`` over the generator's columnar batches,
then ``flush``), not generating the events: "engine alone". Every point runs in
this one process with a fresh engine, so compare ratios, not absolutes: each
point prints native / SASE for events/s and peak state.

  K1  SEQ(Temperature+ t[], Smoke s) WHERE [room] AND t[i].value > t[i-1].value
      WITHIN 1 min USING skip-till-next-match                 (iot profile, seed 3)
  K2  K1 AND count(t) >= 3 AND avg(t.value) > 30
  S1  SEQ(T0 a, T1 b, T2 c) WHERE [key] WITHIN 1 s under each of the four
      strategies (uniform profile: 3 types, 100 keys, 1000 events/s of event time)

For each point and engine: events/s, matches, the engine's peak state bytes and
the runs held at the end (SASE under skip-till-any-match without Kleene items: its
stack instances). ``--format N``: K1's matches over N events written as JSON lines
by the match formatter kernel against one Match object at a time (the same bytes).

    python3 bench/bench_strategies.py                    # 10^6 events per point
    python3 bench/bench_strategies.py --sizes 1000000,10000000 --only K1,K2
    python3 bench/bench_strategies.py --engines native      # without the baseline
"""
from __future__ import annotations

import argparse
import time

K1 = ("QUERY k1 PATTERN SEQ(Temperature+ t[], Smoke s) "
      "WHERE [room] AND t[i].value > t[i-1].value WITHIN 1 min USING skip-till-next-match")
K2 = ("QUERY k2 PATTERN SEQ(Temperature+ t[], Smoke s) "
      "WHERE [room] AND t[i].value > t[i-1].value AND count(t) >= 3 AND avg(t.value) > 30 "
      "WITHIN 1 min USING skip-till-next-match")
S1 = "QUERY s1 PATTERN SEQ(T0 a, T1 b, T2 c) WHERE [key] WITHIN 1 s USING {strategy}"
STRATEGIES = ("skip-till-any-match", "skip-till-next-match", "strict-contiguity",
              "partition-contiguity")
CHUNK = 65_536


def stream(profile: str, events: int):
    from dqcep.generator import GeneratorConfig, UniformConfig, generate
    if profile == "iot":
        cfg = GeneratorConfig(profile="iot", events=events, seed=3)
    else:
        cfg = GeneratorConfig(profile="uniform", events=events, seed=1,
                              profile_config=UniformConfig(types=3, keys=100, attributes=1,
                                                           domain=1000, event_rate=1000))
    return generate(cfg, CHUNK)


def point(name: str, text: str, profile: str, events: int, engine_name: str) -> dict:
    from dqcep.baseline import SaseEngine
    from dqcep.experiments.point import feed
    from dqcep.lang import parse
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine
    queries = parse(text).queries
    engine = Engine(build_plan(queries)) if engine_name == "native" else SaseEngine(queries)
    busy, matches, _ = feed([engine], stream(profile, events))
    if engine_name == "native":
        runs = sum(r.live for r in engine.state.runs.values())
    else:
        runs = sum(n.runs if hasattr(n, "runs") else n.instances for n in engine.nfas if n)
    return {"name": name, "engine": engine_name, "events": events, "seconds": busy,
            "events_per_s": events / busy, "matches": matches,
            "peak_state": engine.peak_state_bytes, "runs": runs}


def format_point(events: int) -> None:
    """K1's matches (Kleene lists) through ``match_lines`` and through ``match_line``."""
    from dqcep.io.match_text import match_line, match_lines
    from dqcep.lang import parse
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine, MatchBatch
    engine = Engine(build_plan(parse(K1).queries))
    out = MatchBatch(engine.match_queries)
    for batch in stream("iot", events):
        out += engine.process(batch)
    out += engine.flush()
    started = time.perf_counter()
    kernel = match_lines(out)
    kernel_s = time.perf_counter() - started
    started = time.perf_counter()
    one_by_one = "".join(match_line(m) + "\n" for m in out.to_matches()).encode()
    python_s = time.perf_counter() - started
    print(f"K1 output, {len(out):,} matches from {events:,} events: formatter kernel "
          f"{kernel_s:.3f} s, one Match at a time {python_s:.3f} s ({python_s / kernel_s:.0f}x); "
          f"same bytes: {kernel == one_by_one}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000000", help="events per point, comma-separated")
    ap.add_argument("--only", default="K1,K2,S1", help="which of K1, K2, S1")
    ap.add_argument("--engines", default="native,sase",
                    help="native, sase or both (comma-separated)")
    ap.add_argument("--format", type=int, default=0, metavar="N",
                    help="only time K1's output formatting over N events")
    args = ap.parse_args(argv)
    if args.format:
        format_point(args.format)
        return
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    only = set(args.only.split(","))
    points = []
    if "K1" in only:
        points.append(("K1 next-match", K1, "iot"))
    if "K2" in only:
        points.append(("K2 next-match", K2, "iot"))
    if "S1" in only:
        points += [(f"S1 {s}", S1.format(strategy=s), "uniform") for s in STRATEGIES]
    engines = args.engines.split(",")
    print(f"{'point':<24} {'engine':<7} {'events':>11} {'seconds':>8} {'events/s':>12} "
          f"{'matches':>11} {'peak state':>11} {'runs held':>9}")
    rows = []
    for events in sizes:
        for name, text, profile in points:
            for engine in engines:
                r = point(name, text, profile, events, engine)
                rows.append(r)
                print(f"{name:<24} {engine:<7} {events:>11,} {r['seconds']:>8.2f} "
                      f"{r['events_per_s']:>12,.0f} {r['matches']:>11,} "
                      f"{r['peak_state'] / 1e6:>9.2f} MB {r['runs']:>9,}", flush=True)
            if len(engines) == 2:
                a, b = rows[-2:]
                same = "same matches" if a["matches"] == b["matches"] else "MATCHES DIFFER"
                print(f"{name:<24} {a['engine']} / {b['engine']}: events/s "
                      f"{a['events_per_s'] / b['events_per_s']:.2f}x, peak state "
                      f"{a['peak_state'] / b['peak_state']:.2f}x ({same})", flush=True)
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        for name, _, _ in points:
            for engine in engines:
                a = next(r for r in rows if (r["name"], r["engine"], r["events"]) ==
                         (name, engine, lo))
                b = next(r for r in rows if (r["name"], r["engine"], r["events"]) ==
                         (name, engine, hi))
                print(f"{name} ({engine}): peak state {hi:,} / {lo:,} events = "
                      f"{b['peak_state'] / a['peak_state']:.2f}x")


if __name__ == "__main__":
    main()
