"""The reference matcher: spec section 3, read literally.

This is the oracle every other engine is tested against, so it favours being
obviously right over being fast. It shares only the parser (``dqcep.lang``) with
the rest of dqcep and knows nothing of plans, queues or kernels.

How it works, for one query over a finite set of events:

1. *Positive matches*, bottom-up over the pattern. A partial match is an
   assignment of events to the positive variables of a sub-pattern. A leaf
   ``Type v`` yields every event of that type; ``SEQ`` joins its items' matches
   left to right, each item strictly after the previous one; ``AND`` joins its
   items' matches when their events are disjoint; ``OR`` is the union of its
   branches. Every join keeps max(ts) - min(ts) <= W. These prunings are exact:
   a partial match that breaks one can never grow into a match.
2. *Conditions*: a conjunct is applied as soon as all the variables it names are
   bound (it is ignored in a match where one of them stays unbound); conjuncts
   that contain ``[attr]`` are applied to the complete match.
3. *Negations*: for each complete match, every NOT on the path the match took
   gets its interval from the spec's rules, and the match is dropped if some
   event (or match of the negated sub-pattern) inside the interval, not one of
   the match's own events, satisfies the conjuncts that mention it.
4. ``detected_at`` is start + W if a trailing-SEQ or AND negation lies on the
   path, else the max ts.

Section 5, by its definitions: a Kleene item ``Type+ v[]`` binds a tuple of events
(every non-empty list with strictly increasing ts within the window: up to 2^n - 1
lists of n events, each a partial match of its own); a conjunct naming ``v`` holds
when it holds for every element (or every element from the second on, for ``v[i-1]``
and ``v[1]`` beside ``v[i]``), aggregates and ``v[last]`` read the complete list. A
strategy other than skip-till-any-match is a filter on the complete matches over
stream order (ts, id) of every event of the input (``_Strategy``).

Values and conditions: ``dqcep.baseline.expressions``.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from dqcep.baseline.expressions import (Binding, TableLookup, bind_tables, cell, holds,
                                        members, value_kind)
from dqcep.core.admission import AdmissionRule, Tick
from dqcep.core.events import Event, Match, declared_type_problem, list_aggregate
from dqcep.core.tables import LookupSource, TableSnapshot
from dqcep.lang import ast

INF = math.inf


# -------------------------------------------------------- partial matches


@dataclass(frozen=True)
class _Partial:
    bound: dict[str, Binding]  # positive variable -> event (Kleene: tuple of events)
    start: int               # min ts of the bound events
    end: int                 # max ts of the bound events


@dataclass(frozen=True)
class _Conjunct:
    expr: ast.Expr
    vars: frozenset[str]
    equivalence: bool  # contains [attr]: needs the complete match


class _Context:
    """What one enumeration of partial matches needs."""

    def __init__(self, by_type: dict[str, tuple[list[int], list[Event]]], window: float,
                 lo: float, hi: float, conjuncts: list[_Conjunct],
                 base: dict[str, Event], excluded: frozenset[int],
                 equivalences: list[str], positives_of_base: Sequence[str]):
        self.by_type = by_type
        self.window = window      # max span of a partial match
        self.lo, self.hi = lo, hi  # every event must have lo <= ts <= hi
        self.conjuncts = conjuncts  # applied as soon as fully bound (with base)
        self.base = base          # bindings that are already fixed (negation checks)
        self.excluded = excluded  # event ids that may not be used
        self.equivalences = equivalences  # top-level [attr]s pruned at every join
        self.positives_of_base = positives_of_base

    def events_of(self, etype: str) -> list[Event]:
        ts, evs = self.by_type.get(etype, ([], []))
        i = bisect.bisect_left(ts, self.lo) if self.lo > -INF else 0
        j = bisect.bisect_right(ts, self.hi) if self.hi < INF else len(ts)
        return [e for e in evs[i:j] if e.id not in self.excluded]

    def accept(self, p: _Partial, before: list[frozenset[str]]) -> bool:
        """Apply the conjuncts that became fully bound in ``p`` (not in any input)."""
        names = frozenset(p.bound) | frozenset(self.base)
        env = {**self.base, **p.bound} if self.base else p.bound
        for c in self.conjuncts:
            if c.vars <= names and not any(c.vars <= b for b in before):
                if not holds(c.expr, env, self.positives_of_base or list(p.bound)):
                    return False
        for attr in self.equivalences:
            values = {_comparable(e, attr) for value in p.bound.values() for e in members(value)}
            if len(values) > 1 or None in values:
                return False
        return True

    def equivalence_values(self, ev: Event) -> tuple:
        """``ev``'s values of the top-level [attr]s, as [attr] compares them."""
        return tuple(_comparable(ev, attr) for attr in self.equivalences)

    def equivalence_key(self, p: _Partial) -> tuple | None:
        """The top-level [attr] values that every event of ``p`` shares (``accept`` let no
        other partial match through), read off its first event; None without [attr]s."""
        if not self.equivalences:
            return None
        return self.equivalence_values(next(e for value in p.bound.values()
                                            for e in members(value)))


def _join(ctx: _Context, lefts: list[_Partial], rights: list[_Partial],
          seq: bool) -> list[_Partial]:
    """All combinations of a left and a right partial match that satisfy the operator.

    SEQ: every left event strictly before every right event. AND: disjoint events.
    Both: the combined span stays within the window. Under top-level [attr]s a left meets
    only the rights with its [attr] values: any other pair ``accept`` refuses.
    """
    groups: dict[tuple | None, list[_Partial]] = {}
    for right in sorted(rights, key=lambda r: r.start):
        groups.setdefault(ctx.equivalence_key(right), []).append(right)
    starts = {key: [r.start for r in group] for key, group in groups.items()}
    out = []
    for left in lefts:
        key = ctx.equivalence_key(left)
        if key not in groups:
            continue
        same, key_starts = groups[key], starts[key]
        lo = left.end if seq else left.end - ctx.window
        i = bisect.bisect_right(key_starts, lo) if seq else bisect.bisect_left(key_starts, lo)
        hi = left.start + ctx.window
        j = bisect.bisect_right(key_starts, hi) if hi < INF else len(key_starts)
        left_ids = {e.id for value in left.bound.values() for e in members(value)}
        before = [frozenset(left.bound) | frozenset(ctx.base)]
        for right in same[i:j]:
            start, end = min(left.start, right.start), max(left.end, right.end)
            if end - start > ctx.window:
                continue
            if not seq and any(e.id in left_ids for value in right.bound.values()
                               for e in members(value)):
                continue
            p = _Partial({**left.bound, **right.bound}, start, end)
            if ctx.accept(p, before + [frozenset(right.bound) | frozenset(ctx.base)]):
                out.append(p)
    return out


def _partials(node: ast.Pattern, ctx: _Context) -> list[_Partial]:
    """Every partial match of a positive (sub-)pattern."""
    if isinstance(node, ast.EventPattern):
        out = []
        for ev in ctx.events_of(node.type):
            p = _Partial({node.var: ev}, ev.ts, ev.ts)
            if ctx.accept(p, [frozenset(ctx.base)]):
                out.append(p)
        return out
    if isinstance(node, ast.Kleene):
        return _lists(node, ctx)
    positives = [i for i in node.items if not isinstance(i, ast.Negation)]
    if node.op == ast.OR:
        return [p for item in positives for p in _partials(item, ctx)]
    acc = _partials(positives[0], ctx)
    for item in positives[1:]:
        if not acc:
            break
        acc = _join(ctx, acc, _partials(item, ctx), seq=node.op == ast.SEQ)
    return acc


def _prefix_closed(c: _Conjunct, var: str) -> bool:
    """Does a conjunct over one Kleene variable hold on every prefix of a list it holds
    on? (Element-wise and pair conditions do; aggregates and v[last] need the whole.)"""
    return c.vars == {var} and not c.equivalence and not any(
        isinstance(x, ast.Aggregate) or (isinstance(x, ast.AttrRef)
                                         and x.index == ast.INDEX_LAST)
        for x in ast.walk_expr(c.expr))


def _lists(node: ast.Kleene, ctx: _Context) -> list[_Partial]:
    """Every non-empty list of events of the Kleene item's type, strictly increasing
    in ts, within the window, that satisfies the conditions (each list one partial
    match: up to 2^n - 1 of them). Lists grow one element at a time; conditions that
    hold on every prefix of a list they hold on prune the growth."""
    events = ctx.events_of(node.type)
    prune = [c for c in ctx.conjuncts if _prefix_closed(c, node.var)]

    def fits(lst: tuple) -> bool:
        bound = {**ctx.base, node.var: lst}
        return all(holds(c.expr, bound, [node.var]) for c in prune) and all(
            len({_comparable(e, attr) for e in lst}) == 1 and _comparable(lst[0], attr)
            is not None for attr in ctx.equivalences)  # top-level [attr]s: every element

    # A list grows only by events of its first event's [attr] values: fits refuses others.
    groups: dict[tuple, tuple[list[int], list[Event]]] = {}
    for ev in events:
        group = groups.setdefault(ctx.equivalence_values(ev), ([], []))
        group[0].append(ev.ts)
        group[1].append(ev)

    out = []
    stack = [(ev,) for ev in reversed(events)]
    stack = [lst for lst in stack if fits(lst)]
    while stack:
        lst = stack.pop()
        p = _Partial({node.var: lst}, lst[0].ts, lst[-1].ts)
        if ctx.accept(p, [frozenset(ctx.base)]):
            out.append(p)
        grown = []
        same_ts, same = groups[ctx.equivalence_values(lst[0])]
        for ev in same[bisect.bisect_right(same_ts, lst[-1].ts):]:
            if ev.ts - lst[0].ts > ctx.window:
                break
            if fits(lst + (ev,)):
                grown.append(lst + (ev,))
        stack.extend(reversed(grown))
    return out


# ----------------------------------------------------------------- negation


def _vars_of(node: ast.Item) -> list[str]:
    return [e.var for e, _ in ast.event_patterns(node)]


@dataclass(frozen=True)
class _Gap:
    negation: ast.Negation
    lo: float
    lo_open: bool
    hi: float
    hi_open: bool
    holds_back: bool  # trailing-SEQ or AND negation: detected at start + W


def _gaps(node: ast.Item, bound: dict[str, Event], start: int, end: int,
          w: int) -> list[_Gap]:
    """The negations on the path this match took, with their intervals."""
    if isinstance(node, (ast.EventPattern, ast.Kleene)):
        return []
    assert isinstance(node, ast.Operator)

    def taken(item: ast.Item) -> bool:
        return any(v in bound for v in ast.positive_vars(item))

    def span(item: ast.Item) -> tuple[int, int]:
        ts = [e.ts for v in ast.positive_vars(item) if v in bound for e in members(bound[v])]
        return min(ts), max(ts)

    out: list[_Gap] = []
    if node.op == ast.OR:
        for item in node.items:
            if taken(item):
                out += _gaps(item, bound, start, end, w)
        return out
    items = node.items
    for k, item in enumerate(items):
        if not isinstance(item, ast.Negation):
            out += _gaps(item, bound, start, end, w)
            continue
        if node.op == ast.AND:
            out.append(_Gap(item, end - w, False, start + w, False, True))
            continue
        prev = next((i for i in reversed(items[:k]) if not isinstance(i, ast.Negation)), None)
        nxt = next((i for i in items[k + 1:] if not isinstance(i, ast.Negation)), None)
        if prev is not None and nxt is not None:
            out.append(_Gap(item, span(prev)[1], True, span(nxt)[0], True, False))
        elif prev is None:  # leading NOT
            out.append(_Gap(item, end - w, False, span(nxt)[0], True, False))
        else:  # trailing NOT
            out.append(_Gap(item, span(prev)[1], True, start + w, False, True))
    return out


# ------------------------------------------------------------------- matcher


class _QueryMatcher:
    def __init__(self, q: ast.Query, snapshots: dict[str, TableSnapshot] | None = None,
                 tables: dict[str, ast.LookupTable] | None = None):
        if snapshots:
            q = bind_tables(q, snapshots, tables)
        self.snapshots, self.tables = snapshots or {}, tables or {}
        self.q = q
        self.w = q.within.ms
        self.order = ast.positive_vars(q.pattern)  # output order of variables
        negated = {e.var for e, neg in ast.event_patterns(q.pattern) if neg}
        parts = [_Conjunct(c, ast.expr_vars(c), ast.has_equivalence(c))
                 for c in ast.conjuncts(q.where)]
        self.constant = [c for c in parts if not c.vars and not c.equivalence]
        self.positive = [c for c in parts if (c.vars or c.equivalence)
                         and not c.vars & negated]
        # Pure [attr] conjuncts prune every join; all [attr]s also run on the full match.
        self.prune_equiv = [c.expr.attr for c in self.positive
                            if isinstance(c.expr, ast.Equivalence)]
        self.negation_conjuncts = {
            id(n): [c for c in parts if c.vars & set(_vars_of(n))]
            for n, _ in ast.walk_patterns(q.pattern) if isinstance(n, ast.Negation)}
        self.strategy = _Strategy(q, parts) if q.strategy != ast.ANY_MATCH else None

    def matches(self, by_type, stream: "_Stream") -> list[Match]:
        if not all(holds(c.expr, {}, []) for c in self.constant):
            return []
        early = [c for c in self.positive if not c.equivalence]
        late = [c for c in self.positive if c.equivalence]
        ctx = _Context(by_type, self.w, -INF, INF, early, {}, frozenset(),
                       self.prune_equiv, ())
        out = []
        for p in _partials(self.q.pattern, ctx):
            positives = [v for v in self.order if v in p.bound]
            if not all(holds(c.expr, p.bound, positives) for c in late
                       if c.vars <= p.bound.keys()):
                continue
            gaps = _gaps(self.q.pattern, p.bound, p.start, p.end, self.w)
            if any(self._violated(g, p, positives, by_type) for g in gaps):
                continue
            if self.strategy is not None and not self.strategy.qualifies(p.bound, stream):
                continue
            detected = p.start + self.w if any(g.holds_back for g in gaps) else p.end
            out.append(Match(self.q.name, detected,
                             tuple((v, _ids(p.bound[v])) for v in positives),
                             self._returns(p.bound)))
        return out

    def _violated(self, gap: _Gap, p: _Partial, positives: list[str], by_type) -> bool:
        """Is there an event / sub-pattern match in the gap that the NOT forbids?"""
        # The positive match is complete here, so every conjunct of the negation
        # (including one with [attr]) can run as soon as its variables are bound.
        ctx = _Context(by_type, INF, gap.lo, gap.hi, self.negation_conjuncts[id(gap.negation)],
                       p.bound, frozenset(e.id for value in p.bound.values()
                                          for e in members(value)), [], positives)
        for m in _partials(gap.negation.pattern, ctx):
            inside = all((gap.lo < e.ts if gap.lo_open else gap.lo <= e.ts) and
                         (e.ts < gap.hi if gap.hi_open else e.ts <= gap.hi)
                         for value in m.bound.values() for e in members(value))
            if inside:
                return True
        return False

    def _returns(self, bound: dict[str, Binding]) -> tuple:
        out = []
        for r in self.q.returns:
            ev = bound.get(r.var)
            if ev is None:
                out.append((r.label, None))
            elif r.func is not None:
                out.append((r.label, list_aggregate(r.func, r.attr, ev)))
            elif r.table is not None:
                out.append((r.label, cell(TableLookup(
                    r.table, ast.AttrRef(r.var, r.attr), r.column, r.pos,
                    self.snapshots[r.table], self.tables[r.table].key_type), ev)))
            elif r.attr is None:
                out.append((r.label, _ids(ev)))
            else:
                out.append((r.label, ev.attrs.get(r.attr) if r.attr not in ("ts", "id")
                            else ev.value(r.attr)))
        return tuple(out)


def _lookups(q: ast.Query) -> list[ast.Lookup]:
    found = [e for e in ast.walk_expr(q.where) if isinstance(e, ast.Lookup)] \
        if q.where is not None else []
    return found + [r.lookup for r in q.returns if r.table is not None]


def _ids(value: Binding) -> int | tuple[int, ...]:
    """A binding in a match's output: an event id, or a Kleene list's ids in ts order."""
    return tuple(e.id for e in value) if isinstance(value, tuple) else value.id


# ---------------------------------------------------------------- strategies


class _Stream:
    """Every event of the input in stream order (ts, id): what "between" reads."""

    def __init__(self, events: Iterable[Event]):
        self.events = sorted(events, key=lambda e: (e.ts, e.id))
        self.keys = [(e.ts, e.id) for e in self.events]

    def between(self, a: Event, b: Event) -> list[Event]:
        """The events strictly between a and b in stream order."""
        lo = bisect.bisect_right(self.keys, (a.ts, a.id))
        hi = bisect.bisect_left(self.keys, (b.ts, b.id))
        return self.events[lo:hi]


class _Strategy:
    """A selection strategy as a filter on a complete skip-till-any-match match (spec
    5.2). The pattern is one event or a SEQ of events, Kleene items and negations, so
    a match flattens into its positive events in SEQ order, each in a *slot*."""

    def __init__(self, q: ast.Query, parts: list[_Conjunct]):
        self.name, self.w = q.strategy, q.within.ms
        items = q.pattern.items if isinstance(q.pattern, ast.Operator) else (q.pattern,)
        self.slots = [(i.var, i.type, isinstance(i, ast.Kleene)) for i in items
                      if not isinstance(i, ast.Negation)]
        self.order = [v for v, _, _ in self.slots]
        # what "fits" evaluates: every conjunct but those with aggregates or v[last]
        self.fit = [c for c in parts if not any(
            isinstance(x, ast.Aggregate) or (isinstance(x, ast.AttrRef)
                                             and x.index == ast.INDEX_LAST)
            for x in ast.walk_expr(c.expr))]
        self.partition = [c.expr.attr for c in parts if isinstance(c.expr, ast.Equivalence)]

    def _flat(self, bound: dict[str, Binding]) -> list[tuple[Event, int]]:
        return [(ev, k) for k, (var, _, _) in enumerate(self.slots)
                for ev in members(bound[var])]

    def qualifies(self, bound: dict[str, Binding], stream: _Stream) -> bool:
        flat = self._flat(bound)
        first, last = flat[0][0], flat[-1][0]
        if self.name == ast.NEXT_MATCH:
            return all(self._no_fit_between(flat, j, stream) for j in range(1, len(flat)))
        own = {ev.id for ev, _ in flat}
        between = [e for e in stream.between(first, last) if e.id not in own]
        if self.name == ast.STRICT:
            return not between
        values = [_comparable(first, attr) for attr in self.partition]
        return not any(all(_comparable(e, attr) == v for attr, v in
                           zip(self.partition, values)) for e in between)

    def _no_fit_between(self, flat: list[tuple[Event, int]], j: int,
                        stream: _Stream) -> bool:
        """No event strictly between e_j-1 and e_j fits a next slot after e1..e_j-1."""
        slot = flat[j - 1][1]
        nexts = ([slot] if self.slots[slot][2] else []) + (
            [slot + 1] if slot + 1 < len(self.slots) else [])
        prefix = flat[:j]
        return not any(self._fits(e, s, prefix)
                       for e in stream.between(flat[j - 1][0], flat[j][0]) for s in nexts)

    def _fits(self, e: Event, slot: int, prefix: list[tuple[Event, int]]) -> bool:
        var, etype, kleene = self.slots[slot]
        if e.type != etype or e.ts <= prefix[-1][0].ts or e.ts - prefix[0][0].ts > self.w:
            return False
        bound: dict[str, Binding] = {}
        for ev, k in prefix:
            v, _, is_list = self.slots[k]
            bound[v] = bound.get(v, ()) + (ev,) if is_list else ev
        bound[var] = bound.get(var, ()) + (e,) if kleene else e
        positives = [v for v in self.order if v in bound]
        return all(holds(c.expr, bound, positives) for c in self.fit
                   if c.vars <= bound.keys())


def detection_key(m: Match, by_id: dict[int, Event]) -> tuple:
    """A match's place in detection order (spec section 6): ``last(m)``, ``first(m)``,
    the ascending (ts, id) of its positive events, its events object by variable name."""
    positions = sorted((by_id[i].ts, i) for _, value in m.events
                       for i in (value if isinstance(value, tuple) else (value,)))
    return positions[-1], positions[0], positions, tuple(sorted(m.events))


def after_match(q: ast.Query, matches: list[Match], by_id: dict[int, Event]) -> list[Match]:
    """The matches an after-match policy accepts (spec section 6), literally: per
    partition of the top-level ``[attr]`` values, walked in detection order."""
    if q.after_match is None:
        return matches
    attrs = [c.attr for c in ast.conjuncts(q.where) if isinstance(c, ast.Equivalence)]
    partitions: dict[tuple, list[tuple]] = {}
    for m in matches:
        key = detection_key(m, by_id)
        first = by_id[key[1][1]]  # every positive event carries the partition's values
        part = tuple(_comparable(first, a) for a in attrs)
        partitions.setdefault(part, []).append((key, m))
    accepted = []
    for ordered in partitions.values():
        ordered.sort(key=lambda km: km[0])
        last_accepted = None  # (first, last) of m*
        for (last, first, _, _), m in ordered:
            if last_accepted is None or first > (
                    last_accepted[1] if q.after_match == ast.SKIP_PAST_LAST
                    else last_accepted[0]):
                accepted.append(m)
                last_accepted = (first, last)
    return accepted


def _comparable(ev: Event, attr: str):
    """An attribute's value as [attr] compares it (numbers as binary64); None if absent."""
    try:
        v = ev.value(attr)
    except KeyError:
        return None
    return ("num", float(v)) if value_kind(v) == "num" else (value_kind(v), v)


def _index(events: Iterable[Event]) -> dict[str, tuple[list[int], list[Event]]]:
    groups: dict[str, list[Event]] = {}
    for ev in events:
        groups.setdefault(ev.type, []).append(ev)
    out = {}
    for etype, evs in groups.items():
        evs.sort(key=lambda e: (e.ts, e.id))
        out[etype] = ([e.ts for e in evs], evs)
    return out


class ReferenceMatcher:
    """Every match of every query over a finite, closed stream of events.

    >>> from dqcep.lang import parse
    >>> from dqcep.core.events import Event
    >>> m = ReferenceMatcher(parse("PATTERN SEQ(A a, B b) WITHIN 10").queries)
    >>> [x.events for x in m.run([Event(1, "A", 0), Event(2, "B", 5)])]
    [(('a', 1), ('b', 2))]
    """

    def __init__(self, queries: Sequence[ast.Query],
                 schemas: Sequence[ast.EventSchema] = (),
                 tables: Sequence[ast.LookupTable] = (),
                 lookup_source: LookupSource | None = None,
                 lateness: "AdmissionRule | int | None" = None):
        self.queries = list(queries)
        # spec section 7: the events a run of the engines admits (an AdmissionRule, or a
        # lateness in ms); None: the events as a closed set, in any order (an oracle's)
        self.rule = None if lateness is None else AdmissionRule.of(lateness)
        self.late_ids: list[int] = []  # the events of the last run that were late ...
        self.late_why: list[str] = []  # ... and why (LATE_REASONS)
        self._matchers = [_QueryMatcher(q) for q in queries]
        # lookups read one snapshot of each table per run (the whole input)
        self.tables = {t.name: t for t in tables}
        self.lookup_source = lookup_source
        self.read = sorted({e.table for q in queries for e in _lookups(q)})
        if self.read and lookup_source is None:
            raise ValueError(f"the queries read the tables {', '.join(self.read)}: give "
                             "the matcher a lookup_source (dqcep.core.tables.LookupSource)")
        named = {ev.type for q in queries for ev, _ in ast.event_patterns(q.pattern)}
        # the declared types the queries name: their events must fit the declarations
        self._declared = {s.type: s for s in schemas if s.type in named}
        self.rejected: list[tuple[int, str]] = []  # (event id, why) of the last run

    def _fits(self, e: Event) -> bool:
        schema = self._declared.get(e.type)
        if schema is None:
            return True
        for a in schema.attrs:
            problem = declared_type_problem(e.type, a.name, a.type, e.attrs.get(a.name))
            if problem is not None:
                self.rejected.append((e.id, problem))
                return False
        return True

    def _admitted(self, records: list) -> list[Event]:
        """Spec section 7, in arrival order, as it is written: T(k) and G over the
        admitted events (G over the ticks too); an event is late iff ts < T(k) - L
        (reason ``lateness``) or ts < G - D (``skew``)."""
        self.late_ids, self.late_why = [], []
        if self.rule is None:
            return [r for r in records if not isinstance(r, Tick)]
        lateness, skew, k_attr = (self.rule.lateness, self.rule.tolerance,
                                  self.rule.timeline)
        admitted, last, g = [], {}, None
        for r in records:
            if isinstance(r, Tick):
                g = r.at if g is None else max(g, r.at)
                continue
            k = _timeline_of(r, k_attr)
            t = last.get(k)
            why = "lateness" if t is not None and r.ts < t - lateness else \
                "skew" if g is not None and r.ts < g - skew else None
            if why is not None:
                self.late_ids.append(r.id)
                self.late_why.append(why)
                continue
            admitted.append(r)
            last[k] = r.ts if t is None else max(t, r.ts)
            g = r.ts if g is None else max(g, r.ts)
        return admitted

    def run(self, events: Iterable[Event | Tick]) -> list[Match]:
        """The matches of ``events`` (in arrival order; a stream's ``Tick`` records
        among them move time, spec section 7)."""
        self.rejected = []
        if self.read:
            snapshots = {t: self.lookup_source.snapshot(t) for t in self.read}
            self._matchers = [_QueryMatcher(q, snapshots, self.tables) for q in self.queries]
        events = self._admitted([e for e in events if isinstance(e, Tick) or self._fits(e)])
        by_type, stream = _index(events), _Stream(events)
        out: list[Match] = []
        by_id = {e.id: e for e in events} if any(q.after_match for q in self.queries) else {}
        for qm in self._matchers:
            found = qm.matches(by_type, stream)
            assert len({m.key for m in found}) == len(found), "a match was produced twice"
            out += after_match(qm.q, found, by_id)
        out.sort(key=lambda m: (m.detected_at, m.query, m.events))
        return out


def _timeline_of(e: Event, attr: str | None):
    """The timeline of ``e`` under ``--timeline attr``: the value itself (a number, a
    string and a boolean are never the same value); None: it lacks the attribute."""
    if attr is None:
        return None
    v = e.attrs.get(attr)
    if v is None:
        return None
    return ("bool", v) if isinstance(v, bool) else \
        ("num", float(v)) if isinstance(v, (int, float)) else ("str", v)
