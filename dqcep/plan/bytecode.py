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

Evaluation follows the spec exactly (see ``evaluate``): numbers are binary64,
any failure (missing attribute or slot, a type mismatch, division by zero, a
non-boolean result) makes the whole predicate false, and there is no
short-circuit. The native runtime evaluates the same code in Cython.
"""
from __future__ import annotations

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

    @property
    def signature(self) -> tuple:
        return (self.code, tuple((type(c).__name__, c) for c in self.consts), self.attrs)

    @property
    def has_equivalence(self) -> bool:
        return any(op == Op.EQUIV for op, _, _ in self.code)


def compile_predicate(expr: ast.Expr, slot_of: dict[str, int], equiv_slots: int = 0) -> Predicate:
    """Compile a conjunct; ``slot_of`` maps each variable it names to a slot.

    ``equiv_slots`` is the number of leading slots that are positive variables of
    the query, over which ``[attr]`` is evaluated.
    """
    code: list[tuple[int, int, int]] = []
    consts: list = []
    attrs: list[str] = []

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
            code.append((Op.LOAD, slot_of[e.var], attr_index(e.attr)))
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
    return Predicate(tuple(code), tuple(consts), slots, tuple(attrs), format_expr(expr))


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
             bound: Callable[[int], bool] = lambda s: True) -> bool:
    """Run the predicate. ``load(slot, attr)`` returns a value or MISSING.

    This is the specification of the bytecode (the planner uses it to fold
    constant conjuncts); engines implement the same semantics natively.
    """
    stack: list = []
    try:
        for op, a, b in p.code:
            if op == Op.CONST:
                stack.append(p.consts[a])
            elif op == Op.LOAD:
                v = load(a, p.attrs[b])
                if v is MISSING:
                    raise _Fail
                stack.append(float(v) if _kind(v) == 1 else v)
            elif op == Op.EQUIV:
                values = [load(s, p.attrs[a]) for s in range(b) if bound(s)]
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
    """Evaluate over a record given as a list of Event objects (None = unbound slot)."""
    def load(slot: int, attr: str):
        ev = events[slot]
        if ev is None:
            return MISSING
        try:
            return ev.value(attr)
        except KeyError:
            return MISSING
    return evaluate(p, load, lambda s: events[s] is not None)
