"""``dqcep demo``: the generator's IoT stream through the engine, no services needed.

Generates an IoT sensor stream (``generator``, profile iot) with planted
occurrences of the demo queries (``dqcep/data/iot.cep``), runs it through the
native engine in-process, prints a sample of the matches, the matches per query,
the share of planted occurrences found (recall), and the engine's figures.
"""
from __future__ import annotations

import sys
import time
from importlib import resources

DEMO_QUERIES = "iot.cep"
PLANT_EVERY_MS = 130_000  # > 2 x (window + skew) of every demo query


def demo_queries_path() -> str:
    return str(resources.files("dqcep.data") / DEMO_QUERIES)


def run_demo(events: int = 200_000, seed: int = 1, show: int = 10, out=sys.stdout) -> int:
    from dqcep.io.writers import match_line
    from dqcep.lang import parse_file
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine
    from generator import GeneratorConfig, Planting, StreamGenerator

    path = demo_queries_path()
    queries = parse_file(path).queries
    gen = StreamGenerator(GeneratorConfig(profile="iot", events=events, seed=seed,
                                          plant=Planting(queries=path, every=PLANT_EVERY_MS)))
    engine = Engine(build_plan(queries))
    print(f"dqcep demo: {events:,} IoT sensor events (profile iot, seed {seed}), "
          f"queries from {path}:", file=out)
    for q in queries:
        print(f"  {q.name}", file=out)
    found: set[tuple] = set()
    counts = {q.name: 0 for q in queries}
    shown, busy = 0, 0.0

    def take(batch):
        nonlocal shown
        for m in batch.to_matches():
            counts[m.query] += 1
            found.add((m.query, frozenset(m.events)))
            if shown < show:
                print("  " + match_line(m), file=out)
                shown += 1

    print(f"\nfirst {show} matches:", file=out)
    for batch in gen.batches(16_384):
        t0 = time.perf_counter()
        result = engine.process(batch)
        busy += time.perf_counter() - t0
        take(result)
    t0 = time.perf_counter()
    take(engine.flush())
    busy += time.perf_counter() - t0
    planted = [(t["query"], frozenset(t["events"].items())) for t in gen.truth]
    recalled = sum(1 for p in planted if p in found)
    print("\nmatches per query:", file=out)
    for name, n in counts.items():
        print(f"  {name:<12} {n:>8,}", file=out)
    print(f"\nplanted occurrences found: {recalled} of {len(planted)}", file=out)
    print(f"engine: {engine.events_in:,} events in {busy:.2f} s "
          f"({engine.events_in / busy:,.0f} events/s), peak state "
          f"{engine.peak_state_bytes / 1e6:.1f} MB, late {engine.late}", file=out)
    return 0 if recalled == len(planted) else 1
