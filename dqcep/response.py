"""Measured response times: per query, from the arrival of the event that completed a
match to the match's output.

A match is completed by its latest-arriving event (a bound event or the last element
of a Kleene list). Its response time is the wall-clock time the service handed it to
its output minus the time the MQTT payload holding that event arrived (before the
journal, so the journal's commit is part of it). Matches none of whose events are in
the batch that emitted them (held for a trailing NOT or released by the watermark
later) and events whose arrival is unknown (a replay after a restart) are counted as
``unmeasured``, not guessed.

The work per batch is one ``np.unique`` of the matches' event ids and one
``np.searchsorted`` of the batch's ids into it: no Python work per event.
"""
from __future__ import annotations

import numpy as np

from dqcep.runtime.eventtime import MatchBatch


class Tally:
    """Count, sum and maximum of response times (s), and matches not measured."""

    __slots__ = ("count", "total", "longest", "unmeasured")

    def __init__(self):
        self.count, self.total, self.longest, self.unmeasured = 0, 0.0, 0.0, 0

    def add(self, delays: np.ndarray, unmeasured: int) -> None:
        if len(delays):
            self.count += len(delays)
            self.total += float(delays.sum())
            self.longest = max(self.longest, float(delays.max()))
        self.unmeasured += unmeasured

    def as_dict(self) -> dict:
        return {"matches": self.count, "unmeasured": self.unmeasured,
                "mean_ms": round(1e3 * self.total / self.count, 3) if self.count else None,
                "max_ms": round(1e3 * self.longest, 3) if self.count else None}


class ResponseTimes:
    """Per query: the response times since the start and since ``take_recent()``."""

    def __init__(self, names: list[str]):
        self.names = list(names)
        self.total = {n: Tally() for n in self.names}
        self.recent = {n: Tally() for n in self.names}

    def observe(self, batch: MatchBatch, ids: np.ndarray, arrival: np.ndarray,
                now: float) -> None:
        """``batch``: the matches a batch of events (ids ``ids``) emitted, handed to the
        output at ``now``; ``arrival[i]`` when event ``ids[i]`` arrived (NaN unknown)."""
        if not len(batch):
            return
        completing = [_candidates(ids_, lists) for _, _, ids_, lists in batch.parts]
        every = np.concatenate([c.ravel() for c in completing])
        known = np.unique(every[every >= 0])
        arrived = np.full(len(known) + 1, -np.inf)  # the last cell: not in this batch
        if len(known) and len(ids):
            at = np.minimum(np.searchsorted(known, ids), len(known) - 1)
            hit = known[at] == ids
            arrived[at[hit]] = np.where(np.isnan(arrival[hit]), -np.inf, arrival[hit])
        for (q, _, _, _), cand in zip(batch.parts, completing):
            at = np.searchsorted(known, cand)
            found = (at < len(known)) & (cand >= 0)
            found[found] = known[at[found]] == cand[found]
            cells = np.where(found, at, len(known))
            latest = arrived[cells].max(axis=1) if cand.shape[1] else \
                np.full(len(cand), -np.inf)
            measured = latest > -np.inf
            delays = now - latest[measured]
            name = batch.queries[q][0]
            unmeasured = int(len(latest) - measured.sum())
            self.total[name].add(delays, unmeasured)
            self.recent[name].add(delays, unmeasured)

    def take_recent(self) -> dict[str, dict]:
        """The response times since the last call, per query; starts a new period."""
        out = {n: t.as_dict() for n, t in self.recent.items()}
        self.recent = {n: Tally() for n in self.names}
        return out

    def totals(self) -> dict[str, dict]:
        return {n: t.as_dict() for n, t in self.total.items()}


def _candidates(ids: np.ndarray, lists) -> np.ndarray:
    """Per match, the ids that may have completed it: its bound events and the last
    element of each Kleene list (lists are in ts order); -1 elsewhere."""
    if lists is None or not len(ids):
        return ids
    k = len(lists.columns)
    last = lists.values[lists.offsets[1:] - 1].reshape(len(ids), k)
    return np.hstack([ids, last])
