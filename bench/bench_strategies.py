"""Selection strategies and Kleene runs on the native engine (issue 18: K1, K2, S1).

Only the engine's work is timed (``Engine.process`` over the generator's columnar
batches, then ``flush``), not generating the events: "engine alone". Every point
runs in this one process with a fresh engine, so compare ratios, not absolutes.

  K1  SEQ(Temperature+ t[], Smoke s) WHERE [room] AND t[i].value > t[i-1].value
      WITHIN 1 min USING skip-till-next-match                 (iot profile, seed 3)
  K2  K1 AND count(t) >= 3 AND avg(t.value) > 30
  S1  SEQ(T0 a, T1 b, T2 c) WHERE [key] WITHIN 1 s under each of the four
      strategies (uniform profile: 3 types, 100 keys, 1000 events/s of event time)

For each point: events/s, matches, the engine's peak state bytes and the runs
held at the end. ``--format N``: K1's matches over N events written as JSON lines
by the match formatter kernel against one Match object at a time (the same bytes). The SASE baseline does not run section 5 yet (it refuses it), so
there is no baseline column.

    python3 bench/bench_strategies.py                    # 10^6 events per point
    python3 bench/bench_strategies.py --sizes 1000000,10000000 --only K1,K2
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


def point(name: str, text: str, profile: str, events: int) -> dict:
    from dqcep.lang import parse
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine
    engine = Engine(build_plan(parse(text).queries))
    busy, matches = 0.0, 0
    for batch in stream(profile, events):
        started = time.perf_counter()
        matches += len(engine.process(batch))
        busy += time.perf_counter() - started
    started = time.perf_counter()
    matches += len(engine.flush())
    busy += time.perf_counter() - started
    runs = sum(r.live for r in engine.state.runs.values())
    return {"name": name, "events": events, "seconds": busy, "events_per_s": events / busy,
            "matches": matches, "peak_state": engine.peak_state_bytes, "runs": runs}


def format_point(events: int) -> None:
    """K1's matches (Kleene lists) through ``match_lines`` and through ``match_line``."""
    from dqcep.io.sinks import match_line, match_lines
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
    print(f"{'point':<28} {'events':>11} {'seconds':>8} {'events/s':>12} {'matches':>11} "
          f"{'peak state':>11} {'runs held':>9}")
    rows = []
    for events in sizes:
        for name, text, profile in points:
            r = point(name, text, profile, events)
            rows.append(r)
            print(f"{name:<28} {events:>11,} {r['seconds']:>8.2f} {r['events_per_s']:>12,.0f} "
                  f"{r['matches']:>11,} {r['peak_state'] / 1e6:>9.2f} MB {r['runs']:>9,}",
                  flush=True)
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        for name, _, _ in points:
            a = next(r for r in rows if r["name"] == name and r["events"] == lo)
            b = next(r for r in rows if r["name"] == name and r["events"] == hi)
            print(f"{name}: peak state {hi:,} / {lo:,} events = "
                  f"{b['peak_state'] / a['peak_state']:.2f}x")


if __name__ == "__main__":
    main()
