"""Hypothesis strategies for queries (as ASTs) and event streams.

``queries()`` draws only valid queries (distinct variables, NOT only inside
SEQ/AND, well-typed conditions), so its output must always parse back.
"""
from __future__ import annotations

import functools
import math

from hypothesis import reject, strategies as st

from dqcep.core.events import Event
from dqcep.lang import ast
from dqcep.lang.parser import KEYWORDS

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"
# [A-Za-z_][A-Za-z0-9_]{0,7}, drawn as a first character and a text: from_regex took
# 2 ms a name (a third of the lang fuzzers' time went to drawing names)
IDENT = st.builds(str.__add__, st.sampled_from(_LETTERS),
                  st.text(_LETTERS + "0123456789", max_size=7)).filter(
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
        # Three draws, then the example is given up, as .filter does; without making a
        # filtered strategy per variable (Hypothesis analyses each: 2.5 ms a variable).
        taken = {v for v, _ in self.used}
        for _ in range(3):
            var = self.draw(self.var_names)
            if var not in taken:
                self.used.append((var, negated))
                return var
        reject()


def _pattern(draw, names: _Names, types, depth: int, negated: bool,
             negation_odds: int = 4) -> ast.Pattern:
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        return ast.EventPattern(draw(types), names.fresh(negated))
    op = draw(st.sampled_from([ast.SEQ, ast.AND, ast.OR]))
    n = draw(st.integers(2, 3))
    items: list[ast.Item] = []
    positive = draw(st.integers(0, n - 1))  # at least this item is not negated
    for k in range(n):
        can_negate = op != ast.OR and not negated and k != positive
        if can_negate and draw(st.integers(0, negation_odds - 1)) == 0:
            if draw(st.booleans()):
                inner = ast.EventPattern(draw(types), names.fresh(True))
            else:
                inner = _pattern(draw, names, types, depth - 1, True, negation_odds)
            items.append(ast.Negation(inner))
        else:
            items.append(_pattern(draw, names, types, depth - 1, negated, negation_odds))
    return ast.Operator(op, tuple(items))


NUMBERS = st.one_of(st.integers(0, 10**6), NONNEG_FLOATS)
SMALL_NUMBERS = st.one_of(st.integers(0, 3), st.sampled_from([0.5, 1.5]))


def _num(draw, vars_, attrs, depth, numbers=NUMBERS):
    choice = draw(st.integers(0, 4 if depth > 0 else 1))
    if choice == 0:
        return ast.Number(draw(numbers))
    if choice == 1:
        return ast.AttrRef(draw(st.sampled_from(vars_)), draw(attrs))
    if choice == 2:
        return ast.Unary("-", _num(draw, vars_, attrs, depth - 1, numbers))
    op = draw(st.sampled_from(ast.ARITHMETIC))
    return ast.Binary(op, _num(draw, vars_, attrs, depth - 1, numbers),
                      _num(draw, vars_, attrs, depth - 1, numbers))


@functools.lru_cache(maxsize=None)
def _without(attrs, *names):
    """``attrs`` without ``names``: one filtered strategy per pair, made once."""
    return attrs.filter(lambda a: a not in names)


def _bool(draw, vars_, attrs, depth, numbers=NUMBERS, strings=None):
    if draw(st.integers(0, 3)) == 0:  # the common shape: compare two variables
        return ast.Binary(draw(st.sampled_from(ast.COMPARISONS)),
                          ast.AttrRef(draw(st.sampled_from(vars_)), draw(attrs)),
                          ast.AttrRef(draw(st.sampled_from(vars_)), draw(attrs)))
    choice = draw(st.integers(0, 7 if depth > 0 else 2))
    if choice == 0:
        return ast.Boolean(draw(st.booleans()))
    if choice == 1:
        return ast.Equivalence(draw(_without(attrs, "ts", "id")))
    if choice == 2:  # any attribute may be a boolean, but ts and id are numbers
        return ast.AttrRef(draw(st.sampled_from(vars_)),
                           draw(_without(attrs, "ts", "id")))
    if choice == 3:
        return ast.Unary("NOT", _bool(draw, vars_, attrs, depth - 1, numbers, strings))
    if choice == 4:
        return ast.Binary(draw(st.sampled_from(ast.LOGICAL)),
                          _bool(draw, vars_, attrs, depth - 1, numbers, strings),
                          _bool(draw, vars_, attrs, depth - 1, numbers, strings))
    if choice == 5:
        text = strings if strings is not None else st.text(st.characters(exclude_characters="\n", codec="utf-8"),
                                  max_size=6)
        return ast.Binary(draw(st.sampled_from(ast.EQUALITY)),
                          ast.AttrRef(draw(st.sampled_from(vars_)),
                                      draw(_without(attrs, "ts", "id"))),
                          ast.String(draw(text)))
    return ast.Binary(draw(st.sampled_from(ast.COMPARISONS)),
                      _num(draw, vars_, attrs, depth - 1, numbers),
                      _num(draw, vars_, attrs, depth - 1, numbers))


WINDOWS = st.builds(ast.Within, st.integers(0, 10**6), st.sampled_from(list(ast.UNIT_MS)))


@st.composite
def queries(draw, types=IDENT, var_names=IDENT, attrs=IDENT, max_depth=3, name=None,
            windows=WINDOWS, numbers=NUMBERS, strings=None, negation_odds=4):
    names = _Names(draw, var_names)
    attrs = _without(attrs, "type")  # v.type and [type] are refused (no attribute)
    pattern = _pattern(draw, names, types, draw(st.integers(0, max_depth)), False,
                       negation_odds)
    vars_ = [v for v, _ in names.used]
    where = None
    if draw(st.booleans()):
        where = _bool(draw, vars_, attrs, draw(st.integers(0, 3)), numbers, strings)
        # top-level conjuncts the way users write them: several, joined by AND
        for _ in range(draw(st.integers(0, 2))):
            more = _bool(draw, vars_, attrs, draw(st.integers(0, 2)), numbers, strings)
            where = ast.Binary("AND", where, more)
    within = draw(windows)
    positives = [v for v, neg in names.used if not neg]
    returns = []
    for var in draw(st.lists(st.sampled_from(positives), unique=True, max_size=3)):
        returns.append(ast.ReturnItem(var, draw(st.one_of(st.none(), attrs))))
    qname = name if name is not None else draw(IDENT)
    return ast.Query(qname, pattern, where, within, tuple(returns))


@st.composite
def query_files(draw, max_queries=3, **query_kwargs):
    qs = []
    for k in range(draw(st.integers(1, max_queries))):
        qs.append(draw(queries(name=f"query{k}", **query_kwargs)))
    return ast.QueryFile("<test>", tuple(qs))


# ------------------------------------------------------------- small worlds
# Few types, attributes and values, small windows: matches are frequent, so
# differential tests exercise every rule instead of agreeing on empty sets.

SMALL_TYPES = st.sampled_from(["A", "B", "C"])
SMALL_ATTRS = st.sampled_from(["p", "q"])
SMALL_VARS = st.builds(str.__add__, st.sampled_from("abcdefgh"),  # [a-h][0-9]?
                       st.sampled_from(["", *"0123456789"]))
SMALL_WINDOWS = st.builds(ast.Within, st.integers(0, 12), st.just("ms"))


def small_queries(name=None, max_depth=2):
    return queries(types=SMALL_TYPES, var_names=SMALL_VARS, attrs=SMALL_ATTRS,
                   max_depth=max_depth, name=name, windows=SMALL_WINDOWS,
                   numbers=SMALL_NUMBERS, strings=st.sampled_from(["x", "y"]),
                   negation_odds=2)


@st.composite
def small_query_files(draw, max_queries=3):
    """Query files whose queries often share sub-patterns: later queries may copy an
    earlier one with other variable names and another window."""
    qs = []
    for k in range(draw(st.integers(1, max_queries))):
        if qs and draw(st.booleans()):
            base = draw(st.sampled_from(qs))
            q = _renamed(base, draw)
            q = ast.Query(f"query{k}", q.pattern, q.where, draw(SMALL_WINDOWS), q.returns)
        else:
            q = draw(small_queries(name=f"query{k}"))
        qs.append(q)
    return ast.QueryFile("<test>", tuple(qs))


def _renamed(q: ast.Query, draw) -> ast.Query:
    """The same query with every variable renamed (v -> v + '_r')."""
    import dataclasses

    def walk(node):
        if isinstance(node, ast.EventPattern):
            return ast.EventPattern(node.type, node.var + "_r")
        if isinstance(node, ast.AttrRef):
            return ast.AttrRef(node.var + "_r", node.attr)
        if isinstance(node, ast.ReturnItem):
            return ast.ReturnItem(node.var + "_r", node.attr)
        if dataclasses.is_dataclass(node):
            changes = {}
            for f in dataclasses.fields(node):
                value = getattr(node, f.name)
                if isinstance(value, tuple):
                    changes[f.name] = tuple(walk(x) for x in value)
                elif dataclasses.is_dataclass(value):
                    changes[f.name] = walk(value)
            return dataclasses.replace(node, **changes)
        return node

    return walk(q)


ATTR_VALUES = st.one_of(st.integers(0, 3), st.sampled_from([0.5, 1.5]), st.booleans(),
                        st.sampled_from(["x", "y"]))


@st.composite
def small_event_streams(draw, max_events=12, max_ts=15):
    n = draw(st.integers(0, max_events))
    out = []
    for i in range(n):
        attrs = {a: draw(ATTR_VALUES) for a in ("p", "q", "room") if draw(st.integers(0, 4))}
        if "room" in attrs:
            attrs["room"] = draw(st.sampled_from(["r1", "r2"]))
        out.append(Event(i + 1, draw(SMALL_TYPES), draw(st.integers(0, max_ts)), attrs))
    return out


@st.composite
def negation_queries(draw, name="neg"):
    """SEQ/AND queries built around NOT: every position, sub-patterns, OR branches and
    conjuncts that tie the negated variable to positive ones."""
    counter = iter(range(100))

    def leaf(prefix):
        return ast.EventPattern(draw(SMALL_TYPES), f"{prefix}{next(counter)}")

    op = draw(st.sampled_from([ast.SEQ, ast.AND]))
    positives = [leaf("x") for _ in range(draw(st.integers(1, 3)))]
    if draw(st.booleans()):  # one positive item is itself an operator
        positives[0] = ast.Operator(draw(st.sampled_from([ast.SEQ, ast.AND, ast.OR])),
                                    (leaf("x"), leaf("x")))
    items: list[ast.Item] = list(positives)
    for _ in range(draw(st.integers(1, 2))):
        if draw(st.integers(0, 2)) == 0:
            negated = ast.Operator(draw(st.sampled_from([ast.SEQ, ast.AND, ast.OR])),
                                   (leaf("n"), leaf("n")))
        else:
            negated = leaf("n")
        items.insert(draw(st.integers(0, len(items))), ast.Negation(negated))
    pattern: ast.Pattern = ast.Operator(op, tuple(items))
    wrap = draw(st.integers(0, 3))
    if wrap == 1:  # the negation sits in one branch of an OR
        pattern = ast.Operator(ast.OR, (pattern, leaf("x")))
    elif wrap == 2:  # ... or in a SEQ/AND nested in another operator
        pattern = ast.Operator(draw(st.sampled_from([ast.SEQ, ast.AND])),
                               (leaf("x"), pattern) if draw(st.booleans()) else (pattern, leaf("x")))
    pos_vars = ast.positive_vars(pattern)
    neg_vars = [e.var for e, neg in ast.event_patterns(pattern) if neg]
    conj: list[ast.Expr] = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.integers(0, 3))
        n = ast.AttrRef(draw(st.sampled_from(neg_vars)), draw(SMALL_ATTRS))
        if kind == 0:
            other = ast.AttrRef(draw(st.sampled_from(pos_vars)), draw(SMALL_ATTRS))
        elif kind == 1:
            other = ast.AttrRef(draw(st.sampled_from(neg_vars)), draw(SMALL_ATTRS))
        elif kind == 2:
            other = ast.Number(draw(st.integers(0, 3)))
        else:
            conj.append(ast.Equivalence("room"))
            continue
        conj.append(ast.Binary(draw(st.sampled_from(ast.COMPARISONS)), n, other))
    where = None
    for c in conj:
        where = c if where is None else ast.Binary("AND", where, c)
    return ast.Query(name, pattern, where, draw(SMALL_WINDOWS), ())


@st.composite
def sase_queries(draw, name="sase"):
    """Queries inside the SASE subset: a SEQ of 1-4 events with NOTs of single events
    anywhere (leading, gaps, trailing), conditions over positive and negated
    variables, and [attr] equivalence tests."""
    counter = iter(range(100))
    items: list[ast.Item] = [ast.EventPattern(draw(SMALL_TYPES), f"x{next(counter)}")
                             for _ in range(draw(st.integers(1, 4)))]
    for _ in range(draw(st.integers(0, 2))):
        negated = ast.EventPattern(draw(SMALL_TYPES), f"n{next(counter)}")
        items.insert(draw(st.integers(0, len(items))), ast.Negation(negated))
    pattern: ast.Pattern = items[0] if len(items) == 1 else ast.Operator(ast.SEQ, tuple(items))
    vars_ = [e.var for e, _ in ast.event_patterns(pattern)]
    parts = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            parts.append(ast.Equivalence(draw(st.sampled_from(["p", "q", "room"]))))
        else:
            parts.append(_bool(draw, vars_, SMALL_ATTRS, draw(st.integers(0, 2)),
                               SMALL_NUMBERS, st.sampled_from(["x", "y"])))
    where = None
    for p in parts:
        where = p if where is None else ast.Binary("AND", where, p)
    return ast.Query(name, pattern, where, draw(SMALL_WINDOWS), ())


@st.composite
def kleene_queries(draw, name="kleene", strategies=ast.STRATEGIES):
    """Section 5 queries: a SEQ with 1-3 Kleene items among plain events (or one event
    alone), iteration conditions (v[i] against v[i-1] or v[1], each element against a
    constant or another variable), aggregates, v[last], [attr], NOT gaps where the
    strategy allows them, and every strategy. Under skip-till-any-match the SEQ is
    sometimes an operand of AND beside one more event."""
    strategy = draw(st.sampled_from(strategies))
    counter = iter(range(100))
    n_kleene = draw(st.sampled_from([1, 1, 2, 3]))
    items: list[ast.Item] = [ast.Kleene(draw(SMALL_TYPES), f"k{next(counter)}")
                             for _ in range(n_kleene)]
    items += [ast.EventPattern(draw(SMALL_TYPES), f"x{next(counter)}")
              for _ in range(draw(st.sampled_from([0, 1, 1, 2])))]
    items = draw(st.permutations(items))
    if strategy in (ast.ANY_MATCH, ast.NEXT_MATCH):
        for _ in range(draw(st.integers(0, 1))):
            negated = ast.EventPattern(draw(SMALL_TYPES), f"n{next(counter)}")
            items.insert(draw(st.integers(0, len(items))), ast.Negation(negated))
    pattern = ast.Operator(ast.SEQ, tuple(items)) if len(items) > 1 else items[0]
    if isinstance(pattern, ast.Kleene):  # a Kleene item stands only in a SEQ
        pattern = ast.Operator(ast.SEQ, (pattern, ast.EventPattern(draw(SMALL_TYPES), "x99")))
    if strategy == ast.ANY_MATCH and draw(st.integers(0, 4)) == 0:  # a list beside AND
        pattern = ast.Operator(ast.AND, (pattern, ast.EventPattern(draw(SMALL_TYPES), "y98")))
    kleene = sorted(ast.kleene_vars(pattern))
    plain = [e.var for e, neg in ast.event_patterns(pattern)
             if not neg and isinstance(e, ast.EventPattern)]
    negated = [e.var for e, neg in ast.event_patterns(pattern) if neg]
    ops = st.sampled_from(ast.COMPARISONS)
    parts: list[ast.Expr] = []
    if strategy == ast.PARTITION or draw(st.booleans()):
        parts.append(ast.Equivalence(draw(st.sampled_from(["room", "p"]))))
    for _ in range(draw(st.integers(0, 3))):
        k = draw(st.sampled_from(kleene))
        attr = draw(SMALL_ATTRS)
        kind = draw(st.sampled_from(range(8)))
        if kind == 0:  # each element against the one before
            part = ast.Binary(draw(ops), ast.AttrRef(k, attr, index="i"),
                              ast.AttrRef(k, attr, index="i-1"))
        elif kind == 1:  # each element (plain or [i]) against a constant
            part = ast.Binary(draw(ops), ast.AttrRef(k, attr, index=draw(
                st.sampled_from([None, "i"]))), ast.Number(draw(st.integers(0, 3))))
        elif kind == 2:  # against the first element
            part = ast.Binary(draw(ops), ast.AttrRef(k, attr, index="i"),
                              ast.AttrRef(k, attr, index="1"))
        elif kind == 3:  # the whole list: an aggregate or the last element
            func = draw(st.sampled_from(ast.AGGREGATES))
            left: ast.Expr = (ast.AttrRef(k, attr, index="last") if draw(st.booleans())
                              else ast.Aggregate(func, k, None if func == "count" else attr))
            part = ast.Binary(draw(ops), left, ast.Number(draw(SMALL_NUMBERS)))
        elif kind == 4 and (plain or len(kleene) > 1):  # every element against another var
            other = draw(st.sampled_from(plain + [v for v in kleene if v != k]))
            part = ast.Binary(draw(ops), ast.AttrRef(k, attr), ast.AttrRef(other, attr))
        elif kind == 5 and negated:  # a negated event against each element
            part = ast.Binary(draw(ops), ast.AttrRef(negated[0], attr), ast.AttrRef(k, attr))
        elif kind == 7 and plain:  # plain events only
            part = ast.Binary(draw(ops), ast.AttrRef(draw(st.sampled_from(plain)), attr),
                              ast.AttrRef(draw(st.sampled_from(plain)), draw(SMALL_ATTRS))
                              if draw(st.booleans()) else ast.Number(draw(st.integers(0, 3))))
        else:
            part = ast.Binary(draw(ops), ast.AttrRef(k, "ts", index="i"),
                              ast.AttrRef(k, "ts", index="i-1") if draw(st.booleans())
                              else ast.Number(draw(st.integers(0, 15))))
        parts.append(part)
    where = None
    for p in draw(st.permutations(parts)):
        where = p if where is None else ast.Binary("AND", where, p)
    returns = [ast.ReturnItem(k, None) for k in kleene[:1]]
    returns += [ast.ReturnItem(kleene[0], draw(SMALL_ATTRS) if f != "count" else None, func=f)
                for f in draw(st.lists(st.sampled_from(ast.AGGREGATES), unique=True,
                                       max_size=2))]
    return ast.Query(name, pattern, where, draw(st.builds(ast.Within, st.integers(4, 12),
                                                          st.just("ms"))),
                     tuple(returns), strategy=strategy)


@st.composite
def neighbour_queries(draw, name="neighbours"):
    """Skip-till-any-match SEQs of 2-4 items over A, B, C with one or two Kleene items,
    whose conditions tie a list to its neighbours (issue 40): each element against an
    earlier plain item, a later one or both, against another list, iteration and
    first-element conditions, aggregates and v[last] beside them; [room] and a NOT gap
    sometimes. Made to match often on ``dense_streams``."""
    n = draw(st.integers(2, 4))
    kleene_at = set(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=2)))
    items: list[ast.Item] = [
        ast.Kleene(draw(SMALL_TYPES), f"k{i}") if i in kleene_at
        else ast.EventPattern(draw(SMALL_TYPES), f"x{i}") for i in range(n)]
    if draw(st.integers(0, 3)) == 0:
        items.insert(draw(st.integers(1, n - 1)), ast.Negation(
            ast.EventPattern(draw(SMALL_TYPES), "neg")))
    variables = [f"k{i}" if i in kleene_at else f"x{i}" for i in range(n)]
    lists = [v for v in variables if v.startswith("k")]
    ops = st.sampled_from(["<", ">", "<=", ">=", "!="])
    parts: list[ast.Expr] = []
    if draw(st.integers(0, 2)) == 0:
        parts.append(ast.Equivalence("room"))
    for _ in range(draw(st.integers(1, 3))):
        k = draw(st.sampled_from(lists))
        others = [v for v in variables if v != k]
        kind = draw(st.integers(0, 5))
        if kind <= 1 and others:  # each element against a neighbour (or another list)
            part: ast.Expr = ast.Binary(draw(ops), ast.AttrRef(k, "p"),
                                        ast.AttrRef(draw(st.sampled_from(others)), "p"))
        elif kind == 2:
            part = ast.Binary(draw(ops), ast.AttrRef(k, "q", index="i"),
                              ast.AttrRef(k, "q", index=draw(st.sampled_from(["i-1", "1"]))))
        elif kind == 3:
            func = draw(st.sampled_from(ast.AGGREGATES))
            part = ast.Binary(draw(ops), ast.Aggregate(func, k, None if func == "count"
                                                       else "p"),
                              ast.Number(draw(st.integers(1, 4))))
        elif kind == 4:
            part = ast.Binary(draw(ops), ast.AttrRef(k, "p", index="last"),
                              ast.AttrRef(draw(st.sampled_from(others)), "q") if others
                              else ast.Number(2))
        else:
            part = ast.Binary(draw(ops), ast.AttrRef(k, "q"), ast.Number(draw(st.integers(0, 3))))
        parts.append(part)
    where = None
    for p in parts:
        where = p if where is None else ast.Binary("AND", where, p)
    return ast.Query(name, ast.Operator(ast.SEQ, tuple(items)), where,
                     ast.Within(draw(st.integers(3, 10)), "ms"), ())


@st.composite
def kleene_event_streams(draw, max_events=14):
    """Streams in which Kleene lists form: 6-14 events whose ts grow by 0-2 (bursts
    of equal ts included), in stream order; small enough for any-match to stay
    enumerable."""
    n = draw(st.integers(6, max_events))
    out, ts = [], draw(st.integers(0, 3))
    for i in range(n):
        ts += draw(st.sampled_from([1, 0, 1, 2, 1]))  # shrinks towards steps of 1
        attrs = {a: draw(ATTR_VALUES) for a in ("p", "q") if draw(st.integers(0, 5))}
        if draw(st.integers(0, 5)):
            attrs["room"] = draw(st.sampled_from(["r1", "r2"]))
        out.append(Event(i + 1, draw(SMALL_TYPES), ts, attrs))
    return out


@st.composite
def strategy_queries(draw, name="run"):
    """Spec 5.2 queries that match often: a flat SEQ of 1-3 items over A and B (at most
    one a Kleene item), each non-default strategy, [room] sometimes (always under
    partition-contiguity), at most two simple conditions, a NOT between plain items
    under skip-till-next-match."""
    strategy = draw(st.sampled_from([ast.NEXT_MATCH, ast.STRICT, ast.PARTITION]))
    n = draw(st.integers(1, 3))
    kleene_at = draw(st.none() | st.integers(0, n - 1)) if n > 1 else None
    items: list[ast.Item] = [
        ast.Kleene(draw(st.sampled_from("AB")), f"v{i}") if i == kleene_at
        else ast.EventPattern(draw(st.sampled_from("AB")), f"v{i}") for i in range(n)]
    if strategy == ast.NEXT_MATCH and kleene_at is None and n > 1 and draw(st.booleans()):
        items.insert(draw(st.integers(1, n - 1)), ast.Negation(
            ast.EventPattern(draw(st.sampled_from("ABZ")), "neg")))
    pattern = ast.Operator(ast.SEQ, tuple(items)) if len(items) > 1 else items[0]
    variables = [f"v{i}" for i in range(n)]
    parts: list[ast.Expr] = []
    if strategy == ast.PARTITION or draw(st.booleans()):
        parts.append(ast.Equivalence("room"))
    for _ in range(draw(st.integers(0, 2))):
        a, b = draw(st.sampled_from(variables)), draw(st.sampled_from(variables))
        choice = draw(st.integers(0, 3))
        if choice == 0 and kleene_at is not None:
            k = f"v{kleene_at}"
            parts.append(ast.Binary(draw(st.sampled_from(["<", ">", "<="])),
                                    ast.AttrRef(k, "p", index="i"),
                                    ast.AttrRef(k, "p", index="i-1")))
        elif choice == 1 and kleene_at is not None:
            parts.append(ast.Binary(">=", ast.Aggregate("count", f"v{kleene_at}", None),
                                    ast.Number(draw(st.integers(1, 3)))))
        elif choice == 2 and a != b:
            parts.append(ast.Binary(draw(st.sampled_from(["<", ">", "!="])),
                                    ast.AttrRef(a, "p"), ast.AttrRef(b, "p")))
        else:
            parts.append(ast.Binary("<=", ast.AttrRef(a, "p"), ast.Number(draw(st.integers(1, 3)))))
    where = None
    for p in parts:
        where = p if where is None else ast.Binary("AND", where, p)
    return ast.Query(name, pattern, where, ast.Within(draw(st.integers(3, 10)), "ms"), (),
                     strategy=strategy)


@st.composite
def chain_queries(draw, name="chain"):
    """SEQ chains that match often (the joins a planner can build on demand): 2-5
    events over A and B, [room] often, conditions across items on the small number p,
    a NOT of a single event sometimes (in a gap, in front or behind)."""
    n = draw(st.integers(2, 5))
    items: list[ast.Item] = [ast.EventPattern(draw(st.sampled_from("AB")), f"v{i}")
                             for i in range(n)]
    if draw(st.integers(0, 3)) == 0:
        items.insert(draw(st.integers(0, n)), ast.Negation(
            ast.EventPattern(draw(st.sampled_from("ABZ")), "neg")))
    variables = [f"v{i}" for i in range(n)]
    parts: list[ast.Expr] = []
    if draw(st.integers(0, 2)):
        parts.append(ast.Equivalence("room"))
    for _ in range(draw(st.integers(0, 2))):
        a, b = draw(st.sampled_from(variables)), draw(st.sampled_from(variables))
        if a != b:
            parts.append(ast.Binary(draw(st.sampled_from(["<", ">", "!=", "="])),
                                    ast.AttrRef(a, "p"), ast.AttrRef(b, "p")))
        else:
            parts.append(ast.Binary("<=", ast.AttrRef(a, "p"),
                                    ast.Number(draw(st.integers(1, 3)))))
    where = None
    for p in parts:
        where = p if where is None else ast.Binary("AND", where, p)
    return ast.Query(name, ast.Operator(ast.SEQ, tuple(items)), where,
                     ast.Within(draw(st.integers(2, 10)), "ms"), ())


@st.composite
def strategy_event_streams(draw, max_events=18):
    """6-18 events of A, B and Z (a type no query names), ts growing by 0-2, in two
    rooms, most with a small number p."""
    out, ts = [], 0
    for i in range(draw(st.integers(6, max_events))):
        ts += draw(st.sampled_from([1, 0, 1, 2]))
        attrs = {"p": draw(st.integers(0, 3))} if draw(st.integers(0, 6)) else {}
        if draw(st.integers(0, 6)):
            attrs["room"] = draw(st.sampled_from(["r1", "r2"]))
        out.append(Event(i + 1, draw(st.sampled_from("AAABBZ")), ts, attrs))
    return out


def outside_sase(q: ast.Query) -> str | None:
    """What the SASE baseline must reject in q (None: it is inside the SASE subset:
    an event, or a SEQ of events and Kleene items with NOTs of single events)."""
    p = q.pattern
    if isinstance(p, (ast.EventPattern, ast.Kleene)):
        return None
    if p.op != ast.SEQ:
        return p.op
    for item in p.items:
        if isinstance(item, ast.Negation) and not isinstance(item.pattern, ast.EventPattern):
            return "NOT (pattern)"
        if isinstance(item, ast.Operator):
            return item.op
    return None
