"""Predicates as a small stack bytecode: plain tuples of ints, no Python source.

A compiled predicate reads the events of one record by *slot* (its position in
the record of the vertex that evaluates it), never by variable name, so two
queries that say the same thing with different names compile to the same code
and can share a vertex.

Instruction = (opcode, a, b):

    CONST k 0      push consts[k]
    LOAD  s t      push attribute attrs[t] of the event in slot s (ts/id included)
    EQUIV t n      push [attrs[t]] over the bound slots among 0..n-1
    NEG NOT ADD SUB MUL DIV EQ NE LT LE GT GE AND OR   (operands popped, result pushed)
    AGG_COUNT s 0  push the length of the Kleene list in slot s
    AGG_SUM|AVG|MIN|MAX s t   push that aggregate of attrs[t] over the list in slot s

Kleene lists (spec 5.1). A slot may hold a list of events (``Predicate.lists``
names them, each with its mode): LOAD on a list slot reads *the current element*,
and the predicate holds when it holds for every element (mode EACH) or every
element from the second on (mode PAIRS, for ``v[i-1]`` or ``v[1]`` beside ``v[i]``);
over two lists, for every pair. ``v[i-1]``, ``v[1]`` and ``v[last]`` are *extra
slots* after the record's own (``Predicate.extras``: (PREVIOUS | FIRST | LAST,
list slot)), which the evaluator fills from the list and the current element.

Evaluation follows the spec exactly (see ``evaluate``): numbers are binary64,
any failure (missing attribute or slot, a type mismatch, division by zero, a
non-boolean result) makes the whole predicate false, and there is no
short-circuit. The native runtime evaluates the same code in Cython.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import IntEnum
from typing import Callable, Sequence

from dqcep._kernels.store import OPCODES
from dqcep.lang import ast
from dqcep.lang.printer import format_expr


# The opcodes are the kernel's (declared once, in dqcep/_kernels/store.pxd): the
# code built here is what the native engine evaluates.
Op = IntEnum("Op", OPCODES)


_BINARY = {"+": Op.ADD, "-": Op.SUB, "*": Op.MUL, "/": Op.DIV, "=": Op.EQ, "!=": Op.NE,
           "<": Op.LT, "<=": Op.LE, ">": Op.GT, ">=": Op.GE, "AND": Op.AND, "OR": Op.OR}


@dataclass(frozen=True)
class Predicate:
    """One conjunct, compiled. Equal predicates have equal ``code`` and ``consts``."""

    code: tuple[tuple[int, int, int], ...]
    consts: tuple[float | str | bool, ...]
    slots: tuple[int, ...]     # slots it reads (sorted); required only when all are bound
    attrs: tuple[str, ...]     # attribute names, indexed by LOAD/EQUIV
    text: str                  # the conjunct as written, for explain
    lists: tuple[tuple[int, int], ...] = ()   # (list slot, EACH | PAIRS) it ranges over
    extras: tuple[tuple[int, int], ...] = ()  # extra slot j: (PREVIOUS|FIRST|LAST, list slot)
    width: int = 0             # the record's own slots; extra slot j is width + j

    @property
    def signature(self) -> tuple:
        return (self.code, tuple((type(c).__name__, c) for c in self.consts), self.attrs,
                self.lists, self.extras, self.width if self.extras else 0)

    @property
    def whole_list(self) -> bool:
        """Does it read a complete list (an aggregate or v[last])? Then it is evaluated
        once per list, never element by element as the list grows."""
        return any(op >= Op.AGG_COUNT for op, _, _ in self.code) or any(
            kind == LAST for kind, _ in self.extras)

    @property
    def has_equivalence(self) -> bool:
        return any(op == Op.EQUIV for op, _, _ in self.code)


# modes of a list slot and kinds of extra slots (see the module docstring)
EACH, PAIRS = 0, 1
PREVIOUS, FIRST, LAST = 0, 1, 2
_EXTRA = {ast.INDEX_PREVIOUS: PREVIOUS, ast.INDEX_FIRST: FIRST, ast.INDEX_LAST: LAST}
_AGG = {"count": Op.AGG_COUNT, "sum": Op.AGG_SUM, "avg": Op.AGG_AVG, "min": Op.AGG_MIN,
        "max": Op.AGG_MAX}


def list_modes(expr: ast.Expr, kleene: frozenset[str] | set[str]) -> dict[str, int]:
    """The Kleene variables a conjunct ranges over, each EACH or PAIRS (spec 5.1): it
    names ``v[i]`` / plain ``v.attr`` or ``v[i-1]``; PAIRS when it names ``v[i-1]``, or
    ``v[1]`` beside ``v[i]`` / plain ``v.attr``."""
    refs: dict[str, set] = {}
    for x in ast.walk_expr(expr):
        if isinstance(x, ast.AttrRef) and x.var in kleene:
            refs.setdefault(x.var, set()).add(x.index or ast.INDEX_EACH)
    return {var: PAIRS if ast.INDEX_PREVIOUS in idx or ast.INDEX_FIRST in idx else EACH
            for var, idx in refs.items()
            if ast.INDEX_EACH in idx or ast.INDEX_PREVIOUS in idx}


def compile_predicate(expr: ast.Expr, slot_of: dict[str, int], equiv_slots: int = 0,
                      kleene: frozenset[str] = frozenset(), width: int = 0) -> Predicate:
    """Compile a conjunct; ``slot_of`` maps each variable it names to a slot.

    ``equiv_slots`` is the number of leading slots that are positive variables of
    the query, over which ``[attr]`` is evaluated. ``kleene``: the variables whose
    slots hold lists; ``width``: the record's slots (extra slots follow them).
    """
    code: list[tuple[int, int, int]] = []
    consts: list = []
    attrs: list[str] = []
    extras: list[tuple[int, int]] = []

    def slot(e: ast.AttrRef) -> int:
        if e.var not in kleene or e.index in (None, ast.INDEX_EACH):
            return slot_of[e.var]
        extra = (_EXTRA[e.index], slot_of[e.var])
        if extra not in extras:
            extras.append(extra)
        return width + extras.index(extra)

    def attr_index(name: str) -> int:
        if name not in attrs:
            attrs.append(name)
        return attrs.index(name)

    def const(value) -> None:
        for i, c in enumerate(consts):
            if type(c) is type(value) and c == value:
                code.append((Op.CONST, i, 0))
                return
        consts.append(value)
        code.append((Op.CONST, len(consts) - 1, 0))

    def emit(e: ast.Expr) -> None:
        if isinstance(e, ast.Number):
            const(float(e.value))
        elif isinstance(e, (ast.String, ast.Boolean)):
            const(e.value)
        elif isinstance(e, ast.AttrRef):
            code.append((Op.LOAD, slot(e), attr_index(e.attr)))
        elif isinstance(e, ast.Aggregate):
            code.append((_AGG[e.func], slot_of[e.var],
                         attr_index(e.attr) if e.attr is not None else 0))
        elif isinstance(e, ast.Equivalence):
            code.append((Op.EQUIV, attr_index(e.attr), equiv_slots))
        elif isinstance(e, ast.Unary):
            emit(e.operand)
            code.append((Op.NEG if e.op == "-" else Op.NOT, 0, 0))
        else:
            emit(e.left)
            emit(e.right)
            code.append((_BINARY[e.op], 0, 0))

    emit(expr)
    slots = tuple(sorted({slot_of[v] for v in ast.expr_vars(expr)}))
    modes = list_modes(expr, kleene)
    if any(op == Op.EQUIV for op, _, _ in code):  # [attr] covers every element of a list
        for v in kleene:
            if v in slot_of and slot_of[v] < equiv_slots:
                modes.setdefault(v, EACH)
    lists = tuple(sorted((slot_of[v], mode) for v, mode in modes.items()))
    return Predicate(tuple(code), tuple(consts), slots, tuple(attrs), format_expr(expr),
                     lists, tuple(extras), width if extras else 0)


# ------------------------------------------------------------------ evaluation


class _Fail(Exception):
    pass


MISSING = object()


def _num(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Fail
    return float(v)


def _kind(v) -> int:
    return 0 if isinstance(v, bool) else 1 if isinstance(v, (int, float)) else 2


def evaluate(p: Predicate, load: Callable[[int, str], object],
             bound: Callable[[int], bool] = lambda s: True,
             aggregate: Callable[[int, int, str], object] | None = None,
             each: Callable[[int, str], list] | None = None) -> bool:
    """Run the predicate once. ``load(slot, attr)`` returns a value or MISSING;
    ``aggregate(opcode, slot, attr)`` the aggregate of the list in a slot, or MISSING
    (an element lacks the attribute or holds no number there); ``each(slot, attr)`` the
    values ``[attr]`` compares in a slot: one, or every element of a list.

    This is the specification of the bytecode (the planner uses it to fold
    constant conjuncts); engines implement the same semantics natively. Ranging
    over Kleene lists is ``evaluate_on_events``'s.
    """
    stack: list = []
    try:
        for op, a, b in p.code:
            if op >= Op.AGG_COUNT:
                v = aggregate(op, a, p.attrs[b] if op != Op.AGG_COUNT else "")
                if v is MISSING:
                    raise _Fail
                stack.append(float(v))
            elif op == Op.CONST:
                stack.append(p.consts[a])
            elif op == Op.LOAD:
                v = load(a, p.attrs[b])
                if v is MISSING:
                    raise _Fail
                stack.append(float(v) if _kind(v) == 1 else v)
            elif op == Op.EQUIV:
                values = [v for s in range(b) if bound(s) for v in (
                    each(s, p.attrs[a]) if each is not None else [load(s, p.attrs[a])])]
                if any(v is MISSING for v in values) or len({_kind(v) for v in values}) > 1:
                    raise _Fail
                values = [float(v) if _kind(v) == 1 else v for v in values]
                stack.append(all(v == values[0] for v in values))
            elif op == Op.NEG:
                stack.append(-_num(stack.pop()))
            elif op == Op.NOT:
                v = stack.pop()
                if not isinstance(v, bool):
                    raise _Fail
                stack.append(not v)
            else:
                right, left = stack.pop(), stack.pop()
                stack.append(_binary(op, left, right))
    except _Fail:
        return False
    (result,) = stack
    return result is True


def _binary(op: int, left, right):
    if op in (Op.AND, Op.OR):
        if not isinstance(left, bool) or not isinstance(right, bool):
            raise _Fail
        return (left and right) if op == Op.AND else (left or right)
    if op in (Op.EQ, Op.NE):
        if _kind(left) != _kind(right):
            raise _Fail
        return (left == right) if op == Op.EQ else (left != right)
    x, y = _num(left), _num(right)
    if op == Op.ADD:
        return x + y
    if op == Op.SUB:
        return x - y
    if op == Op.MUL:
        return x * y
    if op == Op.DIV:
        if y == 0:
            raise _Fail
        return x / y
    return {Op.LT: x < y, Op.LE: x <= y, Op.GT: x > y, Op.GE: x >= y}[op]


def evaluate_on_events(p: Predicate, events: Sequence) -> bool:
    """Evaluate over a record given as a list of Event objects (None = unbound slot; a
    tuple of events: a Kleene list). Over lists the predicate must hold for every
    element (from the second on for PAIRS), for every pair of two lists' elements."""
    def value(ev, attr: str):
        try:
            return ev.value(attr)
        except KeyError:
            return MISSING

    def aggregate(op: int, slot: int, attr: str):
        elements = events[slot]
        if op == Op.AGG_COUNT:
            return len(elements)
        values = [value(ev, attr) for ev in elements]
        if any(v is MISSING or _kind(v) != 1 for v in values):
            return MISSING
        if op in (Op.AGG_SUM, Op.AGG_AVG):
            total = 0.0
            for v in values:  # left to right, in ts order
                total += float(v)
            return total if op == Op.AGG_SUM else total / len(values)
        return float(min(values) if op == Op.AGG_MIN else max(values))

    def run(record: list) -> bool:
        def load(slot: int, attr: str):  # slots past the record's: v[i-1], v[1], v[last]
            ev = record[slot] if slot < len(record) else None
            return MISSING if ev is None else value(ev, attr)
        def each(slot: int, attr: str):  # [attr] covers every element of a list
            ev = events[slot]
            return [value(x, attr) for x in ev] if isinstance(ev, tuple) else [load(slot, attr)]
        return evaluate(p, load, lambda s: events[s] is not None, aggregate, each)

    ranged = dict(p.lists)
    choices = []
    for slot, mode in p.lists:
        lst = events[slot]
        ks = range(1, len(lst)) if mode == PAIRS else range(len(lst))
        choices.append([(slot, k) for k in ks])
    for combination in itertools.product(*choices):
        current = dict(combination)
        record = [ev if s not in ranged else events[s][current[s]]
                  for s, ev in enumerate(events)]
        record += [None] * max(0, p.width - len(record))
        for kind, slot in p.extras:
            lst = events[slot]
            if kind == PREVIOUS:
                record.append(lst[current[slot] - 1] if slot in current else None)
            else:
                record.append(lst[0] if kind == FIRST else lst[-1])
        if not run(record):
            return False
    return True
