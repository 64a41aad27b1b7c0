"""source -> engine -> sinks: what every path does with a batch of events.

``dqcep run`` on a file, the streaming service and each query consumer of its
workers read their events differently (a file's chunks, journal records) and say
what went wrong differently (stderr, dead-letter files), but every batch takes the
same road, written once here:

    1. repeated event ids dropped, the first copy kept (``dqcep.runtime.duplicates``)
    2. lookup tables read again where due: one snapshot per batch
    3. RETURN values: the batch's events remembered
    4. the engine (K-slack reordering; late events left out)
    5. what the engine refused (a declared schema), the queries it stopped (their
       budget) and the events it left out late: handed back to the caller, which
       says them where its users look (stderr, dead letters); late ones counted
    6. the matches to the match sink (RETURN values filled in)

A ``Pipeline`` keeps no other state than its counters and the recent ids (the
caller checkpoints ``recent.ids()`` with the engine's snapshot); the engine, the
sink and the lookup tables are the caller's.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from dqcep.core.events import Event
from dqcep.runtime.duplicates import RECENT_IDS
from dqcep.runtime.engine import EventColumns, MatchBatch

COUNTS = ("events_in", "duplicates", "late", "matches_out")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Outcome:
    """What one batch did. ``kept``: the input's rows that went in (None: all of them);
    ``events``: those rows; the rest as the engine said it."""

    events: EventColumns
    kept: np.ndarray | None
    matches: MatchBatch | None
    refused: list[tuple[int, str]] = field(default_factory=list)  # (event id, why)
    stopped: list[tuple[str, str]] = field(default_factory=list)  # (query, why)
    late: list[int] = field(default_factory=list)                 # event ids ...
    late_why: list[str] = field(default_factory=list)             # ... and why each


class BadEvents:
    """``--on-bad-event``, the rule for a malformed event record of a file: ``fail``
    raises its error (the run stops with its place), ``skip`` says it and counts it.
    (The service has no choice to make: a bad payload or event is a dead letter.)"""

    def __init__(self, policy: str, say: Callable[[str], None] = _stderr):
        self.policy, self.say, self.skipped = policy, say, 0

    def __call__(self, err) -> None:
        if self.policy == "fail":
            raise err
        self.skipped += 1
        self.say(f"skipped: {err}")


class Pipeline:
    """One engine between a source and a match sink.

    ``recent``: the repeated-id memory (a ``RecentIds``; a fresh one of
    ``RECENT_IDS`` when None); ``returns``: a ``ReturnValues`` (matches then carry
    their RETURN values, and each batch comes with its ``Event`` objects); ``tables``: the
    lookup tables the engine reads (refreshed before each batch); ``counts``: the
    dict the counters live in (the caller's, e.g. a checkpointed one; keys in
    ``COUNTS`` are added, and ``matches.NAME`` for each query's matches); ``warn``:
    where a stale lookup table is said;
    ``report``: called with each ``Outcome`` before its matches are written (a
    ``BadEvents`` that raises there stops a run before them)."""

    def __init__(self, engine, sink=None, *, recent=None, returns=None, tables=None,
                 counts: dict | None = None, warn: Callable[[str], None] = _stderr,
                 report: Callable[[Outcome], None] | None = None):
        if recent is None:
            from dqcep._kernels.recent_ids import RecentIds
            recent = RecentIds(RECENT_IDS)
        self.engine, self.sink, self.recent = engine, sink, recent
        self.returns, self.tables, self.warn, self.report = returns, tables, warn, report
        self.counts = counts if counts is not None else {}
        for name in COUNTS:
            self.counts.setdefault(name, 0)

    def fresh(self, ids: np.ndarray) -> np.ndarray | None:
        """Which of these event ids are not repeats of ids already seen (counted as
        duplicates); None: every one."""
        fresh = self.recent.admit(np.asarray(ids, np.int64))
        if fresh.all():
            return None
        self.counts["duplicates"] += int((~fresh).sum())
        return fresh

    def process(self, events: EventColumns, write: bool = True, through=None,
                records: Sequence[Event] | None = None) -> Outcome:
        """One batch (in the engine's columns: ``engine.columns`` makes them of events
        read in Python) down the road; the matches written unless ``write`` is False
        (counted either way: a replay whose matches the sink holds already).
        ``through``: what a database sink commits with the rows. ``records``: the
        batch's events as ``Event`` objects, row for row; only for RETURN values, which
        keep them whole."""
        kept = self.fresh(events.id)
        if kept is not None:
            events = events.take(kept)
            if records is not None:
                records = [e for e, keep in zip(records, kept) if keep]
        n = len(events.ts)
        self.counts["events_in"] += n
        if not n:
            return Outcome(events, kept, None)
        self.refresh_tables()
        if self.returns is not None:
            self.returns.remember(records)
        matches = self.engine.process(events)
        return self._after(Outcome(events, kept, matches), write, through)

    def tick(self, at: int, write: bool = True, through=None) -> Outcome:
        """A stream's tick at ``at`` ms (spec section 7): time passes; the matches that
        makes final come out."""
        return self._after(Outcome(EventColumns.empty(0), None, self.engine.tick(at)), write,
                           through)

    def end(self, write: bool = True, through=None) -> Outcome:
        """The end of the stream: the matches held for a trailing NOT (and a policy's
        waiting ones) released."""
        return self._after(Outcome(EventColumns.empty(0), None, self.engine.flush()), write,
                           through)

    def _after(self, out: Outcome, write: bool, through) -> Outcome:
        engine = self.engine
        out.refused = engine.take_rejected()
        out.stopped = engine.take_stopped() if hasattr(engine, "take_stopped") else []
        out.late, out.late_why = engine.take_late(), engine.take_late_why()
        self.counts["late"] += len(out.late)
        if self.report is not None:
            self.report(out)
        if write:
            self.write(out.matches, through)
        else:
            self.counts["matches_out"] += len(out.matches)
        for q, detected, _, _ in out.matches.parts:
            key = "matches." + out.matches.queries[q][0]
            self.counts[key] = self.counts.get(key, 0) + len(detected)
        return out

    def write(self, batch: MatchBatch, through=None) -> None:
        """Matches to the sink (``through``: a database sink's progress)."""
        if not len(batch):
            return
        extra = () if through is None else (through,)
        if self.returns is not None:
            matches = [self.returns.fill(m) for m in batch.to_matches()]
            self.counts["matches_out"] += self.sink.write_matches(matches, *extra) or 0
        else:
            self.counts["matches_out"] += self.sink.write_batch(batch, *extra) or 0

    def refresh_tables(self) -> None:
        """Lookup tables read again where due; a failed read keeps the last snapshot
        and is said."""
        stale = self.tables.refresh() if self.tables is not None else None
        if stale:
            self.warn(f"dqcep: cannot read lookup {stale}; going on with the last snapshot")
