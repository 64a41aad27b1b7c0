"""The service's figures: what the stats line, the stats file (``--stats-file``),
``/status`` and ``/metrics`` show, for the single service and for the coordinator of
``--workers`` alike (docs/operations.md names each figure).

Each side counts its own figures (the single service its consumer's, the coordinator
the reports of its query consumers); what they share is written here once: the
figures of the stream and the query set, what the MQTT source adds to ``/status``,
the newest matches, and the stats file's writing.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

from dqcep.io.journal import journal_bytes
from dqcep.runtime import MatchBatch


def stream_figures(*, names: list[str], events_in: int, stopped, error: str | None,
                   started: float, now: float, inputs: list[str], state: str | None,
                   journal: str) -> dict:
    """The figures both sides compute alike: the rate since ``started`` (time.monotonic),
    the budget stops by query (``stopped``: the names of the queries stopped), whether
    a write fails, the journal's size, the inputs and the state directory."""
    elapsed = max(now - started, 1e-9)
    return {"events_per_s": events_in / elapsed, "journal_bytes": journal_bytes(journal),
            "stopped_by_query": {n: int(n in stopped) for n in names},
            "budget_stops": len(stopped), "failing": int(error is not None),
            "query_count": len(names), "uptime_s": elapsed,
            "inputs": list(inputs), "state": state}


SLOWEST_TIMELINES = 5  # the timelines /status names, the furthest behind first


def time_figures(engine) -> dict:
    """Spec section 7 as an operator sees it: G (``event_time``, the largest ts and
    tick time taken), the watermark (G - D: below it nothing more is admitted), how far
    the watermark lags this machine's clock, late events by reason, and with
    ``--timeline`` the timelines furthest behind G (value, T(k), ms behind)."""
    g, wm = engine.max_seen, engine.wm
    out = {"event_time": g, "watermark": wm,
           "watermark_lag_s": None if wm is None else round(time.time() - wm / 1000, 3),
           "late_by_reason": engine.late_counts(), "slowest_timelines": []}
    if engine.state.timeline is not None and g is not None:
        kinds, vals, tmax = engine.state.timelines.arrays()
        for i in np.argsort(tmax, kind="stable")[:SLOWEST_TIMELINES].tolist():
            out["slowest_timelines"].append({
                "timeline": _timeline_value(int(kinds[i]), float(vals[i]), engine),
                "time": int(tmax[i]), "behind_ms": g - int(tmax[i])})
    return out


def _timeline_value(kind: int, value: float, engine):
    """A timeline's value as the events carry it (None: they lack the attribute)."""
    from dqcep.runtime.compile import KIND_BOOL, KIND_NUM, KIND_STR
    if kind == KIND_STR:
        return engine.dictionary.values[int(value)]
    if kind == KIND_BOOL:
        return bool(value)
    if kind == KIND_NUM:
        return int(value) if value.is_integer() else value
    return None


def query_entries(query_set, texts: dict[str, str], names: list[str]) -> list[dict]:
    """``/status``'s ``queries``: each query's name, text and the journal offset of the
    control record that added it live (None: it runs from the start)."""
    return [{"name": n, "text": texts.get(n),
             "added_at": query_set.epochs[n] - 1 if query_set.epochs.get(n) else None}
            for n in names]


def source_figures(s: dict, source) -> dict:
    """What the MQTT source adds (None: not running): the messages the broker sent again
    after a lost acknowledgement, not journaled twice (this run's; dqcep.io.mqtt), and
    its failing journal write, if any."""
    s["redelivered"] = source.redelivered if source is not None else 0
    if source is not None and source.write_error:
        s["error"], s["failing"] = source.write_error, 1
    return s


def write_stats_file(path: str | None, stats: dict) -> None:
    """The stats as JSON in ``path`` (replaced whole, so a reader never sees half)."""
    if not path:
        return
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(stats, f)
        os.replace(tmp, path)
    except OSError:
        pass  # stats are a view; the line on stderr says the same


def last_matches(batch, k: int) -> list:
    """The last ``k`` matches of a batch, as ``Match`` objects (only those converted)."""
    parts, left = [], k
    for q, detected, ids, lists in reversed(batch.parts):
        if left <= 0:
            break
        n = len(detected)
        start = max(0, n - left)
        rows = np.arange(start, n)
        parts.append((q, detected[start:], ids[start:],
                      None if lists is None else lists.take(rows)))
        left -= n - start
    return MatchBatch(batch.queries, parts[::-1]).to_matches()
