"""The engine's output stage: a query's OUTPUT vertex over its root's new records.

At a query's OUTPUT (``OutputStage._output``) the engine checks the exact window,
the whole-match conditions and the NOT guards checked now, holds the matches that
wait on a trailing or AND negation until start + W (``_hold``, ``_release_held``),
leaves out, for a query added to a running engine, the matches holding an event
from before its addition (``_before_added``), and turns the rest into a
``MatchBatch`` part of event ids (``_part``; a Kleene list's elements apart), or
hands them to the query's after-match policy (``dqcep.runtime.policy.PolicyStage``).

``OutputStage`` is a part of ``dqcep.runtime.engine.Engine``, apart for reading:
its methods read the engine's program, state and store.
"""
from __future__ import annotations

import numpy as np

from dqcep._kernels.chains import match_ids
from dqcep._kernels.ring import RingBuffer
from dqcep.runtime.eventtime import LIST_ID, MatchBatch, MatchLists
from dqcep.runtime.program import QueryProgram
from dqcep.runtime.state import Records


class OutputStage:
    """The OUTPUT vertices of ``Engine`` (see the module docstring)."""

    def _output(self, out: MatchBatch, q: QueryProgram, recs: Records | RingBuffer) -> None:
        """A query's matches among its root's new records (or the ring they were
        written to: a RUN's, a join of ``Program.ring_roots``), to ``out``."""
        if isinstance(recs, RingBuffer):
            if self._plain_output(q):  # the ids straight from the ring, in one pass
                if len(recs):
                    out.parts.append((q.index, *match_ids(recs, self.store, q.var_slots),
                                      None))
                    self.state.stats[q.spec.output].outputs += len(recs)
                return
            recs = Records.from_ring(recs)
        if q.never or not len(recs) or q.index in self.state.stopped:
            return
        if not q.root_within:
            inside = recs.end - recs.start <= q.window
            if not inside.all():
                recs = recs.take(inside)
        if len(recs) and q.preds.n:
            slots = np.ascontiguousarray(recs.slots)
            recs = recs.take(q.preds.mask_lists(self.store, self.state.lists, slots, q.list_mask)
                             if q.list_mask is not None else q.preds.mask(self.store, slots))
        for gv in q.now_guards:
            recs = self._keep(gv, recs)
        if not len(recs):
            return
        if q.held_active:
            recs = self._hold(q, recs)
        self._emit(out, q, recs.end, recs.slots)

    def _plain_output(self, q: QueryProgram) -> bool:
        """Does the query's OUTPUT pass its root's matches on as they are: no
        condition, NOT, list, policy or live boundary of its own, its window no
        narrower than its root's (a join's or RUN's, whose matches are inside it)?"""
        return q.root_within and not (
            q.never or q.index in self.state.stopped or q.preds.n or q.now_guards
            or q.held_guards or q.list_columns or q.spec.after_match is not None
            or q.index in self.state.fresh_since)

    def _hold(self, q: QueryProgram, recs: Records) -> Records:
        """The records a held negation applies to join the query's pending ones (they
        wait until start + W); the others are returned."""
        held = np.zeros(len(recs), bool)
        for active in q.held_active:
            held |= (recs.slots[:, active] >= 0).any(axis=1)
        if not held.any():
            return recs
        hold, pending = recs.take(held), self.state.pending[q.index]
        self.state.pending[q.index] = Records(*(np.concatenate([a, b]) for a, b in zip(
            (pending.start, pending.end, pending.key, pending.slots),
            (hold.start, hold.end, hold.key, hold.slots))))
        return recs.take(~held)

    def _emit(self, out: MatchBatch, q: QueryProgram, detected: np.ndarray, slots: np.ndarray):
        if len(detected):
            picked = slots if q.identity_slots else slots[:, q.var_slots]
            if q.index in self.state.fresh_since:  # added live: only what came after
                keep = ~self._before_added(q, picked)
                if not keep.all():
                    detected, picked = np.asarray(detected)[keep], picked[keep]
                if not len(detected):
                    return
            if q.spec.after_match is not None:  # they wait for their policy's decision
                self._wait_for_policy(q, np.asarray(detected, np.int64), picked)
                return
            out.parts.append(self._part(q, np.asarray(detected, np.int64), picked))
            self.state.stats[q.spec.output].outputs += len(detected)

    def _early(self, since: tuple, slots: np.ndarray) -> np.ndarray:
        """Per record of event seqs (-1: unbound): does it hold an event from before
        the addition ``since`` describes (``EngineState.fresh_since``)?"""
        boundary, ids, _ = since
        bound = slots >= 0
        early = (bound & (slots < boundary)).any(axis=1)
        if len(ids) and len(slots):
            early |= (bound & np.isin(self.store.ids_of(np.ascontiguousarray(slots)), ids)
                      ).any(axis=1)
        return early

    def _before_added(self, q: QueryProgram, picked: np.ndarray) -> np.ndarray:
        """Per match of a query added to the running engine: does it hold an event the
        engine held when the query came (in its store: a seq below the boundary; in
        its reorder buffer: one of those ids)? Such a match is not the new query's."""
        since = self.state.fresh_since[q.index]
        boundary, ids, _ = since
        cells = picked.copy()
        list_cols = list(q.list_columns)
        if list_cols:
            cells[:, list_cols] = -1
        old = self._early(since, cells)
        if list_cols:
            handles = np.ascontiguousarray(picked[:, list_cols].ravel())
            offsets, seqs = self.state.lists.elements_of(handles)
            early = seqs < boundary
            if len(ids) and len(seqs):
                early |= np.isin(self.store.ids_of(seqs.reshape(-1, 1))[:, 0], ids)
            per_list = np.add.reduceat(early.astype(np.int64), offsets[:-1]) \
                if len(seqs) else np.zeros(len(handles), np.int64)
            per_list[offsets[:-1] == offsets[1:]] = 0  # reduceat of an empty range
            old |= per_list.reshape(len(picked), len(list_cols)).any(axis=1)
        return old

    def _part(self, q: QueryProgram, detected: np.ndarray, picked: np.ndarray) -> tuple:
        """A MatchBatch part: the matches' event ids (list handles: their elements' ids,
        apart)."""
        lists = None
        if q.list_columns:
            handles = picked[:, list(q.list_columns)]
            picked = picked.copy()
            picked[:, list(q.list_columns)] = -1
            lists = self._list_ids(q.list_columns, handles)
        ids = self.store.ids_of(np.ascontiguousarray(picked))
        if lists is not None:
            ids[:, list(q.list_columns)] = LIST_ID
        return q.index, detected, ids, lists

    def _list_ids(self, columns: tuple[int, ...], handles: np.ndarray) -> MatchLists:
        """The event ids of each list, in ts order, row by row."""
        offsets, seqs = self.state.lists.elements_of(np.ascontiguousarray(handles.ravel()))
        values = self.store.ids_of(seqs.reshape(-1, 1))[:, 0]
        return MatchLists(tuple(columns), offsets, values)

    def _release_held(self, q: QueryProgram, wm: int | None) -> MatchBatch:
        """Held matches whose start + W is behind the watermark (all when wm is None)."""
        out = MatchBatch(self.match_queries)
        p = self.state.pending[q.index]
        if not len(p):
            return out
        due = np.ones(len(p), bool) if wm is None else p.start + q.window < wm
        if not due.any():
            return out
        ready, self.state.pending[q.index] = p.take(due), p.take(~due)
        for gv in q.held_guards:
            ready = self._keep(gv, ready)
        self._emit(out, q, ready.start + q.window, ready.slots)
        return out
