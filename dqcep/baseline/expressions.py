"""The reference matcher's conditions: spec section 3's expressions, read literally.

A condition is evaluated over the events a partial match binds (``holds``): a
variable's event, or the elements of a Kleene list, one at a time or whole
(aggregates). Lookups read the snapshot of their table a run binds to the query
(``bind_tables``).

Values: numbers (int or float) are compared and computed as binary64 floats;
a conjunct whose evaluation fails anywhere (missing attribute, mismatched
types, division by zero, a non-boolean result) is false. Evaluation does not
short-circuit, so ``a.x = 1 OR b.missing = 2`` fails as a whole.

Part of the reference matcher (``dqcep.baseline.reference``): it shares only the
parser and the value rules of ``dqcep.core`` with the rest of dqcep.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Sequence, Union

from dqcep.core.events import Event, Value, list_aggregate
from dqcep.core.tables import TableSnapshot, lookup_key
from dqcep.lang import ast


class _Fail(Exception):
    """Evaluation of a conjunct failed: the conjunct is false."""


def _number(v: Value) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Fail
    return float(v)


def value_kind(v: Value) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "num"
    return "str"


Binding = Union[Event, tuple]  # an event, or a Kleene variable's list of events


def members(value: Binding) -> tuple[Event, ...]:
    """The events a variable's binding holds (one, or a Kleene list)."""
    return value if isinstance(value, tuple) else (value,)


def _element(e: ast.AttrRef, bound: dict[str, Binding],
             elements: dict[str, tuple[Event, Event | None]]) -> Event:
    """The event ``e`` reads: a plain variable's, or one element of a Kleene list."""
    value = bound[e.var]
    if not isinstance(value, tuple):
        return value
    if e.index == ast.INDEX_FIRST:
        return value[0]
    if e.index == ast.INDEX_LAST:
        return value[-1]
    current, previous = elements[e.var]
    return previous if e.index == ast.INDEX_PREVIOUS else current


@dataclass(frozen=True)
class TableLookup(ast.Lookup):
    """A lookup with the snapshot of its table that this run reads."""

    snapshot: TableSnapshot | None = None
    key_type: str = ""


def cell(e: ast.Lookup, ev: Event) -> Value | None:
    """The cell a lookup reads for the event holding its key (``dqcep.core.tables``: the
    rule); None: no key attribute, no row or no value there."""
    assert isinstance(e, TableLookup)
    key = ev.value(e.key.attr) if e.key.attr in ("ts", "id") else ev.attrs.get(e.key.attr)
    return e.snapshot.value(lookup_key(key, e.key_type), e.column)


def _looked_up(e: ast.Lookup, ev: Event) -> Value:
    """A lookup's value in a condition; a missing one fails."""
    v = cell(e, ev)
    if v is None:
        raise _Fail
    return float(v) if value_kind(v) == "num" else v


def bind_tables(q: ast.Query, snapshots: dict[str, TableSnapshot],
                 tables: dict[str, ast.LookupTable]) -> ast.Query:
    """The query with every lookup of its condition holding its table's snapshot."""
    def bind(e: ast.Expr) -> ast.Expr:
        if isinstance(e, ast.Lookup):
            return TableLookup(e.table, e.key, e.column, e.pos, snapshots[e.table],
                                tables[e.table].key_type)
        if isinstance(e, ast.Unary):
            return ast.Unary(e.op, bind(e.operand), e.pos)
        if isinstance(e, ast.Binary):
            return ast.Binary(e.op, bind(e.left), bind(e.right), e.pos)
        return e
    return q if q.where is None else dataclasses.replace(q, where=bind(q.where))


def aggregate(e: ast.Aggregate, events: Sequence[Event]) -> float:
    """count / sum / avg / min / max over a complete list, in ts order
    (``dqcep.core.events.list_aggregate``); an element without the attribute or with a
    non-number there fails."""
    value = list_aggregate(e.func, e.attr, events)
    if value is None:
        raise _Fail
    return float(value)


def evaluate(e: ast.Expr, bound: dict[str, Binding], positives: Sequence[str],
             elements: dict[str, tuple[Event, Event | None]] | None = None) -> Value:
    """Value of ``e``; ``positives`` are the bound positive variables for ``[attr]``;
    ``elements`` gives the element ``v[i]`` / plain ``v`` (and ``v[i-1]``) of each
    Kleene variable ranged over (see ``holds``)."""
    if isinstance(e, ast.Number):
        return float(e.value)
    if isinstance(e, (ast.String, ast.Boolean)):
        return e.value
    if isinstance(e, ast.AttrRef):
        try:
            v = _element(e, bound, elements or {}).value(e.attr)
        except KeyError:
            raise _Fail from None
        return float(v) if value_kind(v) == "num" else v
    if isinstance(e, ast.Aggregate):
        return aggregate(e, bound[e.var])
    if isinstance(e, ast.Lookup):
        return _looked_up(e, _element(e.key, bound, elements or {}))
    if isinstance(e, ast.Equivalence):
        values = []
        for var in positives:
            for ev in members(bound[var]):
                try:
                    values.append(ev.value(e.attr))
                except KeyError:
                    raise _Fail from None
        kinds = {value_kind(v) for v in values}
        if len(kinds) > 1:
            raise _Fail  # comparing values of different types fails
        if kinds == {"num"}:
            values = [float(v) for v in values]
        return all(v == values[0] for v in values)
    if isinstance(e, ast.Unary):
        v = evaluate(e.operand, bound, positives, elements)
        if e.op == "-":
            return -_number(v)
        if not isinstance(v, bool):
            raise _Fail
        return not v
    assert isinstance(e, ast.Binary)
    # No short-circuit: both sides are always evaluated (see module docstring).
    left = evaluate(e.left, bound, positives, elements)
    right = evaluate(e.right, bound, positives, elements)
    op = e.op
    if op in ("AND", "OR"):
        if not isinstance(left, bool) or not isinstance(right, bool):
            raise _Fail
        return (left and right) if op == "AND" else (left or right)
    if op in ast.EQUALITY:
        if value_kind(left) != value_kind(right):
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


def _ranges(e: ast.Expr, bound: dict[str, Binding]) -> list[tuple[str, bool]]:
    """The Kleene variables a conjunct ranges over, each with whether it ranges over
    (element, element before) pairs from the second element on (spec 5.1): it names
    ``v[i-1]``, or ``v[1]`` beside ``v[i]`` / plain ``v.attr``."""
    refs: dict[str, set] = {}
    for x in ast.walk_expr(e):
        if isinstance(x, ast.AttrRef) and isinstance(bound.get(x.var), tuple):
            refs.setdefault(x.var, set()).add(x.index or ast.INDEX_EACH)
    out = []
    for var, idx in refs.items():
        if ast.INDEX_EACH in idx or ast.INDEX_PREVIOUS in idx:
            pairs = ast.INDEX_PREVIOUS in idx or ast.INDEX_FIRST in idx
            out.append((var, pairs))
    return out


def holds(e: ast.Expr, bound: dict[str, Binding], positives: Sequence[str]) -> bool:
    """A conjunct holds iff it evaluates, without failing, to true; over Kleene lists,
    iff it does so for every element (every pair of elements of two lists)."""
    ranged = _ranges(e, bound)
    if not ranged:
        try:
            return evaluate(e, bound, positives) is True
        except _Fail:
            return False
    choices = []
    for var, pairs in ranged:
        events = bound[var]
        if pairs:  # true for a one-element list: no pair to check
            choices.append([(var, (events[k], events[k - 1])) for k in range(1, len(events))])
        else:
            choices.append([(var, (ev, None)) for ev in events])
    for combination in itertools.product(*choices):
        try:
            if evaluate(e, bound, positives, dict(combination)) is not True:
                return False
        except _Fail:
            return False
    return True
