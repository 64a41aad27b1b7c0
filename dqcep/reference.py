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

Values: numbers (int or float) are compared and computed as binary64 floats;
a conjunct whose evaluation fails anywhere (missing attribute, mismatched
types, division by zero, a non-boolean result) is false. Evaluation does not
short-circuit, so ``a.x = 1 OR b.missing = 2`` fails as a whole.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from dqcep.events import Event, Match, Value
from dqcep.lang import ast

INF = math.inf


# --------------------------------------------------------------- evaluation


class _Fail(Exception):
    """Evaluation of a conjunct failed: the conjunct is false."""


def _number(v: Value) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Fail
    return float(v)


def _kind(v: Value) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "num"
    return "str"


def evaluate(e: ast.Expr, bound: dict[str, Event], positives: Sequence[str]) -> Value:
    """Value of ``e``; ``positives`` are the bound positive variables for ``[attr]``."""
    if isinstance(e, ast.Number):
        return float(e.value)
    if isinstance(e, (ast.String, ast.Boolean)):
        return e.value
    if isinstance(e, ast.AttrRef):
        try:
            v = bound[e.var].value(e.attr)
        except KeyError:
            raise _Fail from None
        return float(v) if _kind(v) == "num" else v
    if isinstance(e, ast.Equivalence):
        values = []
        for var in positives:
            try:
                values.append(bound[var].value(e.attr))
            except KeyError:
                raise _Fail from None
        kinds = {_kind(v) for v in values}
        if len(kinds) > 1:
            raise _Fail  # comparing values of different types fails
        if kinds == {"num"}:
            values = [float(v) for v in values]
        return all(v == values[0] for v in values)
    if isinstance(e, ast.Unary):
        v = evaluate(e.operand, bound, positives)
        if e.op == "-":
            return -_number(v)
        if not isinstance(v, bool):
            raise _Fail
        return not v
    assert isinstance(e, ast.Binary)
    # No short-circuit: both sides are always evaluated (see module docstring).
    left = evaluate(e.left, bound, positives)
    right = evaluate(e.right, bound, positives)
    op = e.op
    if op in ("AND", "OR"):
        if not isinstance(left, bool) or not isinstance(right, bool):
            raise _Fail
        return (left and right) if op == "AND" else (left or right)
    if op in ast.EQUALITY:
        if _kind(left) != _kind(right):
            raise _Fail
        return (left == right) if op == "=" else (left != right)
    a, b = _number(left), _number(right)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            raise _Fail
        return a / b
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def holds(e: ast.Expr, bound: dict[str, Event], positives: Sequence[str]) -> bool:
    """A conjunct holds iff it evaluates, without failing, to true."""
    try:
        return evaluate(e, bound, positives) is True
    except _Fail:
        return False


# -------------------------------------------------------- partial matches


@dataclass(frozen=True)
class _Partial:
    bound: dict[str, Event]  # positive variable -> event
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
            values = set()
            for ev in p.bound.values():
                try:
                    v = ev.value(attr)
                except KeyError:
                    return False
                values.add((_kind(v), float(v) if _kind(v) == "num" else v))
            if len(values) > 1:
                return False
        return True


def _join(ctx: _Context, lefts: list[_Partial], rights: list[_Partial],
          seq: bool) -> list[_Partial]:
    """All combinations of a left and a right partial match that satisfy the operator.

    SEQ: every left event strictly before every right event. AND: disjoint events.
    Both: the combined span stays within the window.
    """
    rights = sorted(rights, key=lambda r: r.start)
    starts = [r.start for r in rights]
    out = []
    for left in lefts:
        lo = left.end if seq else left.end - ctx.window
        i = bisect.bisect_right(starts, lo) if seq else bisect.bisect_left(starts, lo)
        hi = left.start + ctx.window
        j = bisect.bisect_right(starts, hi) if hi < INF else len(starts)
        left_ids = {e.id for e in left.bound.values()}
        before = [frozenset(left.bound) | frozenset(ctx.base)]
        for right in rights[i:j]:
            start, end = min(left.start, right.start), max(left.end, right.end)
            if end - start > ctx.window:
                continue
            if not seq and any(e.id in left_ids for e in right.bound.values()):
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
    positives = [i for i in node.items if not isinstance(i, ast.Negation)]
    if node.op == ast.OR:
        return [p for item in positives for p in _partials(item, ctx)]
    acc = _partials(positives[0], ctx)
    for item in positives[1:]:
        if not acc:
            break
        acc = _join(ctx, acc, _partials(item, ctx), seq=node.op == ast.SEQ)
    return acc


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
    if isinstance(node, ast.EventPattern):
        return []
    assert isinstance(node, ast.Operator)

    def taken(item: ast.Item) -> bool:
        return any(v in bound for v in ast.positive_vars(item))

    def span(item: ast.Item) -> tuple[int, int]:
        ts = [bound[v].ts for v in ast.positive_vars(item) if v in bound]
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
    def __init__(self, q: ast.Query):
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

    def matches(self, by_type) -> list[Match]:
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
            detected = p.start + self.w if any(g.holds_back for g in gaps) else p.end
            out.append(Match(self.q.name, detected,
                             tuple((v, p.bound[v].id) for v in positives),
                             self._returns(p.bound)))
        return out

    def _violated(self, gap: _Gap, p: _Partial, positives: list[str], by_type) -> bool:
        """Is there an event / sub-pattern match in the gap that the NOT forbids?"""
        # The positive match is complete here, so every conjunct of the negation
        # (including one with [attr]) can run as soon as its variables are bound.
        ctx = _Context(by_type, INF, gap.lo, gap.hi, self.negation_conjuncts[id(gap.negation)],
                       p.bound, frozenset(e.id for e in p.bound.values()), [], positives)
        for m in _partials(gap.negation.pattern, ctx):
            inside = all((gap.lo < e.ts if gap.lo_open else gap.lo <= e.ts) and
                         (e.ts < gap.hi if gap.hi_open else e.ts <= gap.hi)
                         for e in m.bound.values())
            if inside:
                return True
        return False

    def _returns(self, bound: dict[str, Event]) -> tuple:
        out = []
        for r in self.q.returns:
            label = r.var if r.attr is None else f"{r.var}.{r.attr}"
            ev = bound.get(r.var)
            if ev is None:
                out.append((label, None))
            elif r.attr is None:
                out.append((label, ev.id))
            else:
                out.append((label, ev.attrs.get(r.attr) if r.attr not in ("ts", "id")
                            else ev.value(r.attr)))
        return tuple(out)


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
    >>> from dqcep.events import Event
    >>> m = ReferenceMatcher(parse("PATTERN SEQ(A a, B b) WITHIN 10").queries)
    >>> [x.events for x in m.run([Event(1, "A", 0), Event(2, "B", 5)])]
    [(('a', 1), ('b', 2))]
    """

    def __init__(self, queries: Sequence[ast.Query]):
        self._matchers = [_QueryMatcher(q) for q in queries]

    def run(self, events: Iterable[Event]) -> list[Match]:
        by_type = _index(events)
        out: list[Match] = []
        for qm in self._matchers:
            found = qm.matches(by_type)
            assert len({m.key for m in found}) == len(found), "a match was produced twice"
            out += found
        out.sort(key=lambda m: (m.detected_at, m.query, m.events))
        return out
