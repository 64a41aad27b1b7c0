"""One measurement point, ``run_point(spec)``, in a process of its own.

The orchestrator (``dqcep.experiments.run``) forks one process per point so
that the peak RSS is the point's own. The point's result:

- ``matches``, ``peak_state_bytes`` (the engine's own count of its queues,
  stacks, stores and held matches), ``vertices`` (native: the plan's);
- ``seconds``: the engine's time (``process`` + ``flush``) per repeat, a fresh
  engine each time; generating the stream is not timed;
- ``rss_base`` / ``rss_peak`` (bytes): the process's peak RSS before the first
  engine was built and at the end (the stream is generated chunk by chunk
  while it is fed, so it adds one chunk, not the whole stream);
- latency mode: per-match detection latency (``latency_ms`` p50/p99) and
  throughput, see ``_latency``.
"""
from __future__ import annotations

import resource
import time

import numpy as np

CHUNK = 65_536


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _queries(spec: dict):
    from dqcep.experiments.workloads import SHARING, WORKLOADS, sharing_queries
    from dqcep.lang import parse
    if spec["workload"] == "sharing":
        return SHARING, parse(sharing_queries(spec["queries"])).queries
    w = WORKLOADS[spec["workload"]]
    queries = parse(w.queries).queries
    if spec.get("query"):  # one query of the workload alone
        queries = tuple(q for q in queries if q.name == spec["query"])
    return w, queries


def _engines(kind: str, queries) -> list:
    """Fresh engines for one run: native (one shared plan), on-demand (the same plan
    with every join that can be built on demand so built), separate (one native
    engine per query: no sharing), or sase."""
    from dqcep.baseline import SaseEngine
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine
    if kind == "native":
        return [Engine(build_plan(queries))]
    if kind == "on-demand":
        return [Engine(build_plan(queries, materialize="on-demand"))]
    if kind == "separate":
        return [Engine(build_plan([q])) for q in queries]
    if kind == "sase":
        return [SaseEngine(queries)]
    raise ValueError(f"unknown engine {kind!r}")


def _run_once(kind: str, workload, queries, events: int, seed: int) -> tuple[float, int, int]:
    """(engine seconds, matches, peak state bytes) of one fresh run."""
    if kind == "reference":
        from dqcep.baseline.reference import ReferenceMatcher
        evs = [e for b in workload.stream(events, seed, CHUNK) for e in b.to_events()]
        t0 = time.perf_counter()
        n = len(ReferenceMatcher(queries).run(evs))
        return time.perf_counter() - t0, n, 0
    return feed(_engines(kind, queries), workload.stream(events, seed, CHUNK))


def feed(engines: list, batches) -> tuple[float, int, int]:
    """Every batch through every engine, then flush: (seconds spent in the engines,
    matches, peak state bytes). Producing the batches is not timed."""
    busy, matches = 0.0, 0
    for batch in batches:
        t0 = time.perf_counter()
        for e in engines:
            matches += len(e.process(batch))
        busy += time.perf_counter() - t0
    t0 = time.perf_counter()
    for e in engines:
        matches += len(e.flush())
    busy += time.perf_counter() - t0
    return busy, matches, sum(e.peak_state_bytes for e in engines)


def _holds_back(queries) -> np.ndarray:
    """Per query (all in the SASE subset): is a match held until the watermark passes
    start + W, i.e. does the query end in a NOT?"""
    from dqcep.baseline import compile_sase
    return np.array([any(mode == "TRAILING" for _, mode, _ in compile_sase(q).negations)
                     for q in queries], dtype=bool)


def _latency(kind: str, workload, queries, events: int, seed: int, chunk: int) -> dict:
    """Detection latency: for each match, from the arrival of the chunk that holds
    its last needed event to the return of the call that emitted it.

    Chunks of ``chunk`` events are handed to the engine one after the other at
    full speed (arrival = the moment a chunk is handed over). The last needed
    event of a match is its last event (ts = detected_at); for a match held by
    a trailing NOT it is the first event after start + W, whose arrival moves
    the watermark past it. Events come in ts order (no imperfections), so the
    chunk is found from the chunks' largest ts.
    """
    (engine,) = _engines(kind, queries)
    held = _holds_back(queries)
    arrival, max_ts, emitted = [], [], []  # per call: (return time, its matches)
    started = time.perf_counter()
    for batch in workload.stream(events, seed, chunk):
        arrival.append(time.perf_counter())
        max_ts.append(int(batch.ts.max()) if len(batch) else -(2 ** 62))
        out = engine.process(batch)
        emitted.append((time.perf_counter(), out))
    out = engine.flush()
    emitted.append((time.perf_counter(), out))
    seconds = time.perf_counter() - started
    arrival_a, max_ts_a = np.array(arrival), np.maximum.accumulate(np.array(max_ts))
    lat = []
    for when, mb in emitted:
        for q, detected, _, _ in mb.parts:
            needed = detected + (1 if held[q] else 0)
            first = np.searchsorted(max_ts_a, needed, side="left")
            first = np.minimum(first, len(arrival_a) - 1)
            lat.append(when - arrival_a[first])
    lat_ms = np.concatenate(lat) * 1000 if lat else np.zeros(0)
    return {"matches": int(lat_ms.size), "seconds": [seconds],
            "p50_ms": float(np.percentile(lat_ms, 50)) if lat_ms.size else 0.0,
            "p99_ms": float(np.percentile(lat_ms, 99)) if lat_ms.size else 0.0,
            "min_ms": float(lat_ms.min()) if lat_ms.size else 0.0,
            "events_per_s": events / seconds if seconds > 0 else 0.0}


def run_point(spec: dict) -> dict:
    """Measure one point; ``spec``: engine, workload, events, seed, repeat, and
    optionally query (one query of the workload), queries (sharing: how many) or
    latency_chunk (latency mode)."""
    workload, queries = _queries(spec)
    kind, events, seed = spec["engine"], spec["events"], spec["seed"]
    base = _rss()
    if spec.get("latency_chunk"):
        out = _latency(kind, workload, queries, events, seed, spec["latency_chunk"])
    else:
        runs = [_run_once(kind, workload, queries, events, seed)
                for _ in range(spec.get("repeat", 1))]
        if len({(m, s) for _, m, s in runs}) != 1:
            raise RuntimeError(f"repeats disagree: {[(m, s) for _, m, s in runs]}")
        out = {"seconds": [r[0] for r in runs], "matches": runs[0][1],
               "peak_state_bytes": runs[0][2]}
    if kind in ("native", "on-demand", "separate"):
        from dqcep.plan import build_plan
        plans = [build_plan([q]) for q in queries] if kind == "separate" else \
            [build_plan(queries)]
        out["vertices"] = sum(p.n_vertices for p in plans)
    out.update(rss_base=base, rss_peak=_rss())
    return out
