"""The native engine against its own baseline on the shapes where joins lose (issue 40).

Each shape is a query over a uniform stream (``generator``: 1000 events/s of event
time, the types named, one integer attribute ``a0`` in [0, 100)) at several
windows. Per point, in this one process, on the same decoded batches (generating
them is not timed; ``process`` over batches of ``--chunk`` events, then ``flush``):

- ``native``: the plan ``--materialize`` chooses (default ``auto``, with the
  generator's rates given to the cost model) and the choice it made (joins/chain);
  with ``--adapt`` an ``AdaptiveEngine`` that starts from that plan and moves the
  query where it measures the other construction faster (the choice printed is the
  one it ends with, and ``->`` when it moved);
- ``joins``: the plan with every join's records kept (``always``, the old default);
- ``sase``: the SASE-style baseline (``--engine sase``).

It prints events/s, native / sase and joins / sase, and whether all three made the
same matches. ``--repeat`` runs each engine that many times, alternating, and keeps
the best (machines are shared: compare the ratios).

    python3 bench/bench_plans.py                        # every shape
    python3 bench/bench_plans.py --only tied --events 20000
    python3 bench/bench_plans.py --more                 # the other workloads
"""
from __future__ import annotations

import argparse

# name: (query text with {w} for the window in ms, types in the stream, windows, events;
# the tied list's joins make 2^n lists a window: over the budget at 100 ms, where they
# stop the query: "stopped" is printed and its matches are not compared)
SHAPES = {
    "tied": ("SEQ(T0 a, T1+ b[], T2 c) WHERE b.a0 > a.a0 AND c.a0 < a.a0 WITHIN {w} ms",
             10, (30, 100), 20_000),
    "seq5": ("SEQ(T0 a, T1 b, T2 c, T3 d, T4 e) WITHIN {w} ms", 11, (50, 100), 500_000),
    "seq3": ("SEQ(T0 a, T1 b, T2 c) WITHIN {w} ms", 11, (100, 300), 500_000),
    "filter": ("SEQ(T0 a, T1+ b[], T2 c) WHERE b.a0 > 60 WITHIN {w} ms", 10, (50, 100),
               500_000),
    "rising": ("SEQ(T0 a, T1+ b[], T2 c) WHERE b[i].a0 > b[i-1].a0 WITHIN {w} ms", 10,
               (50, 100), 500_000),
}
# Other workloads of these shapes (``--more``): a list tied the other way, to both
# neighbours, with [key]; SEQs of 4 and 2, one with a condition between its ends, one
# with a NOT between, W2's [key] AND a.a0 < b.a0; a rising list also tied to a; a
# filtered list with an aggregate
MORE = {
    "tied2": ("SEQ(T0 a, T1+ b[], T2 c) WHERE b.a0 < a.a0 AND c.a0 > a.a0 WITHIN {w} ms",
              10, (40, 80), 20_000),
    "tiedboth": ("SEQ(T0 a, T1+ b[], T2 c) WHERE b.a0 > a.a0 AND b.a0 < c.a0 WITHIN {w} ms",
                 10, (40, 80), 20_000),
    "tiedkey": ("SEQ(T0 a, T1+ b[], T2 c) WHERE [key] AND b.a0 > a.a0 WITHIN {w} ms", 10,
                (200, 500), 100_000),
    "seq4": ("SEQ(T0 a, T1 b, T2 c, T3 d) WITHIN {w} ms", 10, (40, 120), 500_000),
    "seq3p": ("SEQ(T0 a, T1 b, T2 c) WHERE a.a0 < c.a0 WITHIN {w} ms", 10, (60, 200),
              500_000),
    "seq2": ("SEQ(T0 a, T1 b) WITHIN {w} ms", 10, (20, 100), 500_000),
    "seqneg": ("SEQ(T0 a, NOT T3 n, T1 b, T2 c) WITHIN {w} ms", 10, (40, 120), 500_000),
    "seqkey": ("SEQ(T0 a, T1 b, T2 c) WHERE [key] AND a.a0 < b.a0 WITHIN {w} ms", 10,
               (200, 600), 500_000),
    "itertied": ("SEQ(T0 a, T1+ b[], T2 c) WHERE b[i].a0 > b[i-1].a0 AND b.a0 > a.a0 "
                 "WITHIN {w} ms", 8, (40, 100), 200_000),
    "kfilt2": ("SEQ(T0 a, T1+ b[], T2 c) WHERE b.a0 > 60 AND count(b) >= 2 WITHIN {w} ms",
               10, (40, 80), 500_000),
}
EVENT_RATE = 1000.0


def batches(types: int, events: int, chunk: int) -> list:
    from dqcep.generator import GeneratorConfig, UniformConfig, generate
    cfg = GeneratorConfig(profile="uniform", events=events, seed=1, profile_config=UniformConfig(
        types=types, keys=10, attributes=1, domain=100, event_rate=EVENT_RATE))
    return list(generate(cfg, chunk))


def run(make, stream: list, repeat: int) -> tuple[float, int, object]:
    """(best seconds, matches, the last engine) of ``repeat`` fresh engines."""
    from dqcep.experiments.point import feed
    best, matches, engine = None, 0, None
    for _ in range(repeat):
        engine = make()
        busy, matches, _ = feed([engine], stream)
        best = busy if best is None else min(best, busy)
    return best, matches, engine


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SHAPES), help="shapes, comma-separated "
                    f"(of {', '.join(SHAPES)}; or of --more's)")
    ap.add_argument("--more", action="store_true",
                    help=f"the other workloads: {', '.join(MORE)}")
    ap.add_argument("--events", type=int, default=0,
                    help="events per shape (default: the shape's own, 2*10^4 or 5*10^5)")
    ap.add_argument("--chunk", type=int, default=4096, help="events per batch")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--materialize", default="auto", help="the native plan's mode")
    ap.add_argument("--adapt", action="store_true",
                    help="native: an adaptive engine (dqcep run --adapt on)")
    args = ap.parse_args(argv)
    from dqcep.runtime.adapt import AdaptiveEngine
    from dqcep.baseline import SaseEngine
    from dqcep.lang import parse
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine

    print(f"{'shape':<8} {'window':>7} {'choice':<7} {'native ev/s':>12} {'joins ev/s':>12} "
          f"{'sase ev/s':>12} {'native/sase':>11} {'joins/sase':>10} {'matches':>10}")
    names = ",".join(MORE) if args.more and args.only == ",".join(SHAPES) else args.only
    for name in names.split(","):
        text, types, windows, events = {**SHAPES, **MORE}[name]
        events = args.events or events
        rates = {f"T{i}": EVENT_RATE / types for i in range(types)}
        stream = batches(types, events, args.chunk)
        for w in windows:
            queries = parse("QUERY q PATTERN " + text.format(w=w)).queries
            plan = build_plan(queries, rates, materialize=args.materialize)
            joins = build_plan(queries, rates, materialize="always")
            seconds, counts, stopped = {}, {}, set()

            def native():
                if args.adapt:
                    return AdaptiveEngine(queries, rates=rates, materialize=args.materialize)
                return Engine(plan)
            choice = plan.queries[0].construction
            for _ in range(args.repeat):  # alternating: the machine's noise on all three
                for engine, make in (("native", native),
                                     ("joins", lambda: Engine(joins)),
                                     ("sase", lambda: SaseEngine(queries))):
                    s, counts[engine], made = run(make, stream, 1)
                    seconds[engine] = min(seconds.get(engine, s), s)
                    if getattr(made, "stopped", None):
                        stopped.add(engine)
                    if engine == "native" and getattr(made, "moves", None):
                        choice = "->" + made.constructions["q"]
            rate = {e: events / s for e, s in seconds.items()}
            same = len({n for e, n in counts.items() if e not in stopped}) == 1
            print(f"{name:<8} {w:>4} ms {choice:<7} "
                  f"{rate['native']:>12,.0f} {rate['joins']:>12,.0f} {rate['sase']:>12,.0f} "
                  f"{rate['native'] / rate['sase']:>10.2f}x {rate['joins'] / rate['sase']:>9.2f}x "
                  f"{counts['sase']:>10,}{'' if same else '  MATCHES DIFFER'}"
                  f"{''.join(f'  ({e} stopped by its budget)' for e in sorted(stopped))}",
                  flush=True)


if __name__ == "__main__":
    main()
