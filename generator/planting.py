"""Planted pattern occurrences and their ground truth.

Every ``every`` ms of event time one occurrence of a query is planted: events
whose types, order, timing and attributes make them a match of the query. An
occurrence is drawn at random (times inside the window, attributes from the
profile's distributions, ``[attr]`` values made equal) and kept only when the
reference matcher, run on the occurrence alone, reports exactly that
assignment as a match; otherwise it is drawn again (up to ``MAX_TRIES``).

So that no background event can cancel it, background events of the types a
query negates are suppressed from ``start - W - skew`` to ``end + W + skew``
around each occurrence (counted as ``suppressed``). Planted events are exempt
from the other imperfections except arrival delay. The ground truth is one line
per complete occurrence: ``{"query", "occurrence", "events": {var: id}}``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dqcep.core.batch import EventBatch, missing_column
from dqcep.core.errors import UserError
from dqcep.lang import ast
from dqcep.baseline.reference import ReferenceMatcher

MAX_TRIES = 2000
PLANT_STREAM = 3  # RNG stream id: (seed, PLANT_STREAM, occurrence)


@dataclass
class Occurrence:
    index: int
    query: str
    vars: list[str]               # one per planted event
    times: np.ndarray             # float ms, true time
    types: np.ndarray             # int32
    columns: dict[str, np.ndarray]
    ids: dict[str, int]           # filled in as the events get ids


def _negated_types(node: ast.Item, negated=False) -> set[str]:
    return {e.type for e, neg in ast.event_patterns(node) if neg}


def default_every(queries: list[ast.Query], skew: int) -> int:
    """Occurrences 10 s apart, or further: more than 2 x (window + clock skew) of the
    longest window, so that no occurrence of a query with a negation can spoil another
    (the rule below), whatever the query file."""
    return max([10_000] + [2 * (q.within.ms + skew) + 1 for q in queries])


class Planter:
    def __init__(self, queries: list[ast.Query], profile, seed: int, start: float,
                 every: int | None, skew: int):
        schema = profile.schema
        if every is None:
            every = default_every(queries, skew)
        for q in queries:
            tables = sorted({e.table for e in ast.walk_expr(q.where)
                             if isinstance(e, ast.Lookup)} if q.where is not None else set())
            if tables:  # the planter would need the rows to build events that fit them
                raise UserError(f"cannot plant query {q.name!r}: it reads the lookup table "
                                f"{', '.join(tables)}; plant a query without lookups "
                                "(--plant-query NAME, or another file)")
            missing = {e.type for e, _ in ast.event_patterns(q.pattern)} - set(schema.types)
            if missing:
                raise UserError(f"cannot plant query {q.name!r}: profile {profile.name} has no "
                                f"event type {', '.join(sorted(missing))} (its types: "
                                f"{', '.join(schema.types)})")
            if _negated_types(q.pattern) and every <= 2 * (q.within.ms + skew):
                raise UserError(f"cannot plant query {q.name!r} every {every} ms: it has a "
                                f"negation, so occurrences must be more than 2 x (window + "
                                f"clock skew) = {2 * (q.within.ms + skew)} ms apart")
        if every < 1:
            raise UserError("plant every must be >= 1 ms")
        self.queries, self.profile, self.schema = queries, profile, schema
        self.seed, self.start, self.every, self.skew = seed, start, every, skew
        self.matchers = {q.name: ReferenceMatcher([q]) for q in queries}
        self.next_k = 0
        self.pending: list[Occurrence] = []   # planned, some events not yet merged
        self.suppress: list[tuple[float, float, frozenset[int]]] = []
        self.occurrences = 0

    # planning -----------------------------------------------------------
    def _anchor(self, k: int) -> float:
        return self.start + (k + 1) * self.every

    def plan_until(self, t_end: float) -> None:
        """Plan every occurrence whose influence (suppression) starts before t_end."""
        while True:
            q = self.queries[self.next_k % len(self.queries)]
            anchor = self._anchor(self.next_k)
            if anchor - q.within.ms - self.skew > t_end:
                return
            occ = self._draw(self.next_k, q, anchor)
            self.pending.append(occ)
            neg = {self.schema.type_code(t) for t in _negated_types(q.pattern)}
            if neg:
                w = q.within.ms + self.skew
                self.suppress.append((occ.times.min() - w, occ.times.max() + w, frozenset(neg)))
            self.next_k += 1

    def _draw(self, k: int, q: ast.Query, anchor: float) -> Occurrence:
        rng = np.random.default_rng([self.seed, PLANT_STREAM, k])
        equivalences = [c.attr for c in ast.conjuncts(q.where) if isinstance(c, ast.Equivalence)]
        for _ in range(MAX_TRIES):
            span = int(rng.integers(0, q.within.ms + 1))
            placed = self._place(q.pattern, rng, 0, span)
            if placed is None:
                continue
            vars_ = [v for v, _, _ in placed]
            types = np.array([self.schema.type_code(t) for _, t, _ in placed], np.int32)
            times = anchor + np.array([t for _, _, t in placed], float)
            cols = {name: missing_column(kind, len(placed)) for name, kind in self.schema.attrs}
            for i, code in enumerate(types):
                sample = self.profile.sample(rng, int(code), 1)
                for name in sample:
                    cols[name][i] = sample[name][0]
            for attr in equivalences:
                if attr in cols:
                    cols[attr][:] = cols[attr][0]
            occ = Occurrence(k, q.name, vars_, times, types, cols, {})
            if self._is_match(q, occ):
                self.occurrences += 1
                return occ
        raise UserError(f"could not plant query {q.name!r}: no draw out of {MAX_TRIES} "
                        "satisfied its pattern and conditions with this profile's values")

    def _place(self, node: ast.Pattern, rng, lo: int, hi: int):
        """[(var, type, time offset)] for one random way through the pattern, or None."""
        if isinstance(node, ast.EventPattern):
            return [(node.var, node.type, int(rng.integers(lo, hi + 1)))]
        if isinstance(node, ast.Kleene):
            raise UserError(f"--plant: {node.pos.line}:{node.pos.col}: planting a Kleene "
                            f"item ({node.type}+ {node.var}[]) is not supported; plant the "
                            "file's other queries")
        items = [i for i in node.items if not isinstance(i, ast.Negation)]
        if node.op == ast.OR:
            return self._place(items[int(rng.integers(0, len(items)))], rng, lo, hi)
        if node.op == ast.AND:
            parts = [self._place(i, rng, lo, hi) for i in items]
        else:  # SEQ: consecutive, disjoint integer sub-ranges
            if hi - lo + 1 < len(items):
                return None
            cuts = np.sort(rng.choice(np.arange(lo + 1, hi + 1), len(items) - 1, replace=False))
            bounds = [lo] + [int(c) for c in cuts] + [hi + 1]
            parts = [self._place(i, rng, bounds[j], bounds[j + 1] - 1)
                     for j, i in enumerate(items)]
        if any(p is None for p in parts):
            return None
        return [x for p in parts for x in p]

    def _is_match(self, q: ast.Query, occ: Occurrence) -> bool:
        n = len(occ.vars)
        events = EventBatch(self.schema, np.arange(n, dtype=np.int64),
                            np.floor(occ.times).astype(np.int64), occ.types,
                            {k: v.copy() for k, v in occ.columns.items()}).to_events()
        want = tuple(sorted((v, i) for i, v in enumerate(occ.vars)))
        return any(tuple(sorted(m.events)) == want
                   for m in self.matchers[q.name].run(events))

    # merging --------------------------------------------------------------
    def suppressed(self, times: np.ndarray, types: np.ndarray) -> np.ndarray:
        mask = np.zeros(len(times), bool)
        for lo, hi, neg in self.suppress:
            mask |= (times >= lo) & (times <= hi) & np.isin(types, list(neg))
        if len(times):
            self.suppress = [s for s in self.suppress if s[1] >= times[-1]]
        return mask

    def take_until(self, t_end: float) -> list[tuple[Occurrence, int]]:
        """(occurrence, event index) of planted events with true time <= t_end."""
        out = []
        for occ in self.pending:
            for i, t in enumerate(occ.times):
                if t <= t_end and occ.vars[i] not in occ.ids:
                    out.append((occ, i))
        return out

    def assign(self, occ: Occurrence, i: int, event_id: int) -> None:
        occ.ids[occ.vars[i]] = event_id

    def complete(self) -> list[Occurrence]:
        done = [o for o in self.pending if len(o.ids) == len(o.vars)]
        self.pending = [o for o in self.pending if len(o.ids) < len(o.vars)]
        return done


