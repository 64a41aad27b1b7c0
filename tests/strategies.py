"""Hypothesis strategies for queries (as ASTs) and event streams.

``queries()`` draws only valid queries (distinct variables, NOT only inside
SEQ/AND, well-typed conditions), so its output must always parse back.
"""
from __future__ import annotations

import math

from hypothesis import strategies as st

from dqcep.lang import ast
from dqcep.lang.parser import KEYWORDS

IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,7}", fullmatch=True).filter(
    lambda s: s.upper() not in KEYWORDS)

NONNEG_FLOATS = st.floats(min_value=0, max_value=1e300, allow_nan=False,
                          allow_infinity=False).filter(lambda f: math.copysign(1, f) > 0)


class _Names:
    """Hands out fresh variable names within one drawn query."""

    def __init__(self, draw, var_names):
        self.draw = draw
        self.var_names = var_names
        self.used: list[tuple[str, bool]] = []  # (var, negated)

    def fresh(self, negated: bool) -> str:
        taken = {v for v, _ in self.used}
        var = self.draw(self.var_names.filter(lambda v: v not in taken))
        self.used.append((var, negated))
        return var


def _pattern(draw, names: _Names, types, depth: int, negated: bool) -> ast.Pattern:
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        return ast.EventPattern(draw(types), names.fresh(negated))
    op = draw(st.sampled_from([ast.SEQ, ast.AND, ast.OR]))
    n = draw(st.integers(2, 3))
    items: list[ast.Item] = []
    positive = draw(st.integers(0, n - 1))  # at least this item is not negated
    for k in range(n):
        can_negate = op != ast.OR and not negated and k != positive
        if can_negate and draw(st.integers(0, 3)) == 0:
            if draw(st.booleans()):
                inner = ast.EventPattern(draw(types), names.fresh(True))
            else:
                inner = _pattern(draw, names, types, depth - 1, True)
            items.append(ast.Negation(inner))
        else:
            items.append(_pattern(draw, names, types, depth - 1, negated))
    return ast.Operator(op, tuple(items))


def _num(draw, vars_, attrs, depth):
    choice = draw(st.integers(0, 4 if depth > 0 else 1))
    if choice == 0:
        return ast.Number(draw(st.one_of(st.integers(0, 10**6), NONNEG_FLOATS)))
    if choice == 1:
        return ast.AttrRef(draw(st.sampled_from(vars_)), draw(attrs))
    if choice == 2:
        return ast.Unary("-", _num(draw, vars_, attrs, depth - 1))
    op = draw(st.sampled_from(ast.ARITHMETIC))
    return ast.Binary(op, _num(draw, vars_, attrs, depth - 1), _num(draw, vars_, attrs, depth - 1))


def _bool(draw, vars_, attrs, depth):
    choice = draw(st.integers(0, 7 if depth > 0 else 2))
    if choice == 0:
        return ast.Boolean(draw(st.booleans()))
    if choice == 1:
        return ast.Equivalence(draw(attrs))
    if choice == 2:
        return ast.AttrRef(draw(st.sampled_from(vars_)), draw(attrs))
    if choice == 3:
        return ast.Unary("NOT", _bool(draw, vars_, attrs, depth - 1))
    if choice == 4:
        return ast.Binary(draw(st.sampled_from(ast.LOGICAL)), _bool(draw, vars_, attrs, depth - 1),
                          _bool(draw, vars_, attrs, depth - 1))
    if choice == 5:
        text = st.text(st.characters(exclude_characters="\n", codec="utf-8"), max_size=6)
        return ast.Binary(draw(st.sampled_from(ast.EQUALITY)),
                          ast.AttrRef(draw(st.sampled_from(vars_)), draw(attrs)),
                          ast.String(draw(text)))
    return ast.Binary(draw(st.sampled_from(ast.COMPARISONS)), _num(draw, vars_, attrs, depth - 1),
                      _num(draw, vars_, attrs, depth - 1))


@st.composite
def queries(draw, types=IDENT, var_names=IDENT, attrs=IDENT, max_depth=3, name=None):
    names = _Names(draw, var_names)
    pattern = _pattern(draw, names, types, draw(st.integers(0, max_depth)), False)
    vars_ = [v for v, _ in names.used]
    where = None
    if draw(st.booleans()):
        where = _bool(draw, vars_, attrs, draw(st.integers(0, 3)))
    within = ast.Within(draw(st.integers(0, 10**6)), draw(st.sampled_from(list(ast.UNIT_MS))))
    positives = [v for v, neg in names.used if not neg]
    returns = []
    for var in draw(st.lists(st.sampled_from(positives), unique=True, max_size=3)):
        returns.append(ast.ReturnItem(var, draw(st.one_of(st.none(), attrs))))
    qname = name if name is not None else draw(IDENT)
    return ast.Query(qname, pattern, where, within, tuple(returns))


@st.composite
def query_files(draw, max_queries=3):
    qs = []
    for k in range(draw(st.integers(1, max_queries))):
        qs.append(draw(queries(name=f"query{k}")))
    return ast.QueryFile("<test>", tuple(qs))
