"""Measured response times: per query, from the arrival of the event that completed a
match, or of the record that made it final, to the match's output.

A match is completed by its latest-arriving event (a bound event or the last element
of a Kleene list). Its response time is the wall-clock time the service handed it to
its output minus the time the MQTT payload holding that event arrived (before the
journal, so the journal's commit is part of it). A match none of whose events is in
the batch that emitted it was held (for --lateness/--skew, a trailing NOT, a policy)
and made final by the batch: it is measured from the arrival of the record that did
that (the first event that took G to its ``detected_at`` + D, or a tick), with the
event time it was held for beside (``held``, ``held_mean_ms``). Matches whose record
arrived at an unknown time (a replay after a restart) or that an end of stream
released are counted as ``unmeasured``, not guessed.

The work per batch is a hash table of its events' ids and one pass of a kernel per
query over its matches' candidates (``dqcep._kernels.arrivals``): no Python work per
event or per match.
"""
from __future__ import annotations

import numpy as np

from dqcep._kernels.arrivals import ArrivalIndex

from dqcep.runtime.eventtime import MatchBatch


# upper bounds (s) of the response-time histogram's buckets (Prometheus's ``le``; the
# last bucket, +Inf, is the count)
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Tally:
    """Count, sum, maximum and histogram of response times (s), and matches not
    measured."""

    __slots__ = ("count", "total", "longest", "unmeasured", "buckets", "held_count",
                 "held_total")

    def __init__(self):
        self.count, self.total, self.longest, self.unmeasured = 0, 0.0, 0.0, 0
        self.buckets = np.zeros(len(BUCKETS) + 1, np.int64)  # per bucket, not cumulative
        self.held_count, self.held_total = 0, 0.0  # matches held, event-time ms they waited

    def add_held(self, held_ms: np.ndarray) -> None:
        if len(held_ms):
            self.held_count += len(held_ms)
            self.held_total += float(held_ms.sum())

    def add(self, delays: np.ndarray, unmeasured: int) -> None:
        if len(delays):
            self.count += len(delays)
            self.total += float(delays.sum())
            self.longest = max(self.longest, float(delays.max()))
            # a delay equal to a bound is in that bucket (le: less than or equal)
            self.buckets += np.bincount(np.searchsorted(BUCKETS, delays, side="left"),
                                        minlength=len(BUCKETS) + 1)
        self.unmeasured += unmeasured

    def as_dict(self, histogram: bool = False) -> dict:
        out = {"matches": self.count, "unmeasured": self.unmeasured,
               "mean_ms": round(1e3 * self.total / self.count, 3) if self.count else None,
               "max_ms": round(1e3 * self.longest, 3) if self.count else None,
               "held": self.held_count,
               "held_mean_ms": round(self.held_total / self.held_count, 3)
               if self.held_count else None}
        if histogram:  # le None: +Inf
            out["histogram"] = {"le": [*BUCKETS, None],
                                "cumulative": np.cumsum(self.buckets).tolist(),
                                "sum_s": self.total}
        return out


class ResponseTimes:
    """Per query: the response times since the start and since ``take_recent()``."""

    def __init__(self, names: list[str]):
        self.names = list(names)
        self.total = {n: Tally() for n in self.names}
        self.recent = {n: Tally() for n in self.names}

    def observe(self, batch: MatchBatch, ids: np.ndarray, arrival: np.ndarray,
                now: float, ts: np.ndarray | None = None, before: int | None = None,
                tolerance: int = 0) -> None:
        """``batch``: the matches a batch of events (ids ``ids``) emitted, handed to the
        output at ``now``; ``arrival[i]`` when event ``ids[i]`` arrived (NaN unknown).

        A match none of whose events is in the batch was held (by the reorder buffer
        for ``--lateness``/``--skew``, a trailing NOT, a policy) and came out because
        the batch moved the engine's time: given the batch's ``ts`` (arrival order),
        G ``before`` it and the engine's D (``tolerance``), it is measured from the
        arrival of the first event that took G to ``detected_at + D`` (the record
        that made it final, spec section 7); ``held_ms`` is how far event time moved
        past ``detected_at`` by then."""
        if not len(batch):
            return
        # matches far outnumber a batch's events (10 example queries: 45 a message):
        # each match's candidates are looked up in a hash table of the batch's ids
        # (a kernel); sorting them (np.unique) was a third of the service's thread
        index = ArrivalIndex(np.ascontiguousarray(ids, np.int64),
                             np.ascontiguousarray(arrival, np.float64))
        g = None
        if ts is not None and len(ts):
            g = np.maximum.accumulate(ts)  # G after each event of the batch
            if before is not None:
                np.maximum(g, before, out=g)
        for q, detected, ids_, lists in batch.parts:
            latest = index.latest(np.ascontiguousarray(_candidates(ids_, lists), np.int64))
            measured = latest > -np.inf
            delays, held = now - latest[measured], np.zeros(0)
            if g is not None and not measured.all():  # finalised by an event of the batch
                due = detected[~measured] + tolerance
                row = np.searchsorted(g, due, side="left")
                found = row < len(g)
                at = arrival[row[found]]
                known = ~np.isnan(at)
                delays = np.concatenate([delays, now - at[known]])
                held = (g[row[found]] - detected[~measured][found])[known].astype(np.float64)
                measured[np.flatnonzero(~measured)[found][known]] = True
            name = batch.queries[q][0]
            unmeasured = int(len(latest) - measured.sum())
            for tally in (self.total[name], self.recent[name]):
                tally.add(delays, unmeasured)
                tally.add_held(held)

    def observe_finalised(self, batch: MatchBatch, arrival: float, now: float,
                          at: int) -> None:
        """``batch``: matches a record without events made final (a tick at time
        ``at``), handed to the output at ``now``; ``arrival``: when that record
        arrived (NaN unknown): each is measured from it, held ``at - detected_at``."""
        for q, detected, _, _ in batch.parts:
            name, n = batch.queries[q][0], len(detected)
            known = not np.isnan(arrival)
            delays = np.full(n if known else 0, max(0.0, now - arrival))
            for tally in (self.total[name], self.recent[name]):
                tally.add(delays, 0 if known else n)
                if known:
                    tally.add_held((at - detected).astype(np.float64))

    def rename(self, names: list[str]) -> None:
        """The queries measured from now on (a live change): a query that stays keeps
        its figures, a new one starts at none."""
        self.names = list(names)
        self.total = {n: self.total.get(n) or Tally() for n in self.names}
        self.recent = {n: self.recent.get(n) or Tally() for n in self.names}

    def take_recent(self) -> dict[str, dict]:
        """The response times since the last call, per query; starts a new period."""
        out = {n: t.as_dict() for n, t in self.recent.items()}
        self.recent = {n: Tally() for n in self.names}
        return out

    def totals(self, histogram: bool = False) -> dict[str, dict]:
        return {n: t.as_dict(histogram) for n, t in self.total.items()}


def _candidates(ids: np.ndarray, lists) -> np.ndarray:
    """Per match, the ids that may have completed it: its bound events and the last
    element of each Kleene list (lists are in ts order); -1 elsewhere."""
    if lists is None or not len(ids):
        return ids
    k = len(lists.columns)
    last = lists.values[lists.offsets[1:] - 1].reshape(len(ids), k)
    return np.hstack([ids, last])


class ServiceTimes:
    """The service's own measured processing: per payload, the time its step took (a
    step of k payloads: k payloads of a k-th of it each), and the delay from a step's
    first payload's arrival to the step's start (the journal's commit and the wake-up).
    ``utilization``: the share of wall-clock time spent in steps. Checkpoints, which
    stop processing while they last, are counted apart (count, mean, second moment),
    and the delay of the first step after one (``checkpointed``) is left out: its wait
    is the checkpoint's, which the model counts as a class of its own."""

    def __init__(self, since: float):
        self.total, self.recent = _StepTally(since), _StepTally(since)
        self._after_checkpoint = False

    def add(self, duration: float, payloads: int, delay: float | None) -> None:
        if self._after_checkpoint:
            delay, self._after_checkpoint = None, False
        for t in (self.total, self.recent):
            t.add(duration, payloads, delay)

    def add_checkpoint(self, duration: float) -> None:
        for t in (self.total, self.recent):
            t.checkpoints += 1
            t.checkpoint_time += duration
            t.checkpoint_squares += duration * duration
        self.checkpointed()

    def checkpointed(self) -> None:
        """A checkpoint held the processing (this service's, or another consumer's in
        the same worker): the next step's delay is not counted."""
        self._after_checkpoint = True

    def take_recent(self, now: float) -> dict:
        out = self.recent.as_dict(now)
        self.recent = _StepTally(now)
        return out

    def totals(self, now: float) -> dict:
        return self.total.as_dict(now)


class _StepTally:
    __slots__ = ("since", "payloads", "busy", "squares", "delays", "delayed", "checkpoints",
                 "checkpoint_time", "checkpoint_squares")

    def __init__(self, since: float):
        self.since = since
        self.payloads, self.busy, self.squares, self.delays, self.delayed = 0, 0.0, 0.0, 0.0, 0
        self.checkpoints, self.checkpoint_time, self.checkpoint_squares = 0, 0.0, 0.0

    def add(self, duration: float, payloads: int, delay: float | None) -> None:
        self.payloads += payloads
        self.busy += duration
        self.squares += duration * duration / payloads
        if delay is not None and delay == delay:  # NaN: the arrival is not known
            self.delays += delay
            self.delayed += 1

    def as_dict(self, now: float) -> dict:
        n = self.payloads
        return {"payloads": n,
                "mean_ms": round(1e3 * self.busy / n, 4) if n else None,
                "m2_ms2": round(1e6 * self.squares / n, 6) if n else None,
                "delay_ms": round(1e3 * self.delays / self.delayed, 4) if self.delayed
                else None,
                "utilization": round(self.busy / max(now - self.since, 1e-9), 4),
                "checkpoints": self.checkpoints,
                "checkpoint_ms": round(1e3 * self.checkpoint_time / self.checkpoints, 4)
                if self.checkpoints else None,
                "checkpoint_m2_ms2": round(1e6 * self.checkpoint_squares / self.checkpoints, 6)
                if self.checkpoints else None}
