"""Parser: every construct, every error class with its position, round trip, fuzzing."""
import dataclasses
import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dqcep.lang import QueryError, ast, file_to_source, parse, parse_file, to_source
from dqcep.lang.ast import (Aggregate, AttrRef, Binary, Boolean, EventPattern, Equivalence,
                            Kleene, Negation, Number, Operator, String, Unary, conjuncts,
                            kleene_vars, positive_vars, walk_expr)
from tests.support.strategies import IDENT, kleene_queries, queries, query_files
from tests.support.examples import examples

FIRE = """QUERY fire
PATTERN SEQ(Temperature t, NOT Rain r, AND(Smoke s, OR(Alarm a, Door d)))
WHERE [room] AND t.value > 50 AND s.density > t.value / 10
WITHIN 30 s
RETURN t, s.density;
"""


def one(text):
    (q,) = parse(text).queries
    return q


# ------------------------------------------------------------------ constructs


def test_spec_example():
    q = one(FIRE)
    assert q.name == "fire"
    assert q.pattern == Operator("SEQ", (
        EventPattern("Temperature", "t"),
        Negation(EventPattern("Rain", "r")),
        Operator("AND", (EventPattern("Smoke", "s"),
                         Operator("OR", (EventPattern("Alarm", "a"),
                                         EventPattern("Door", "d"))))),
    ))
    assert conjuncts(q.where) == [
        Equivalence("room"),
        Binary(">", AttrRef("t", "value"), Number(50)),
        Binary(">", AttrRef("s", "density"),
               Binary("/", AttrRef("t", "value"), Number(10))),
    ]
    assert q.within.ms == 30_000
    assert [(r.var, r.attr) for r in q.returns] == [("t", None), ("s", "density")]


def test_several_queries_default_names_and_comments():
    f = parse("""-- a comment line
    PATTERN A a WITHIN 1;   -- trailing comment
    QUERY named PATTERN SEQ(A a, B b) WITHIN 2 ms;
    pattern and(A a, B b) within 3 S""")
    assert [q.name for q in f.queries] == ["q1", "named", "q3"]
    assert [q.within.ms for q in f.queries] == [1, 2, 3000]


@pytest.mark.parametrize("unit,ms", [("", 7), ("ms", 7), ("s", 7000), ("MIN", 420_000),
                                     ("h", 25_200_000), ("Min", 420_000)])
def test_within_units(unit, ms):
    assert one(f"PATTERN A a WITHIN 7 {unit}").within.ms == ms


def test_keywords_case_insensitive_identifiers_case_sensitive():
    q = one("query Q pattern Seq(A a, A A, not B b) where a.X = A.x within 1 s return A")
    assert q.pattern.items[1] == EventPattern("A", "A")
    assert isinstance(q.pattern.items[2], Negation)
    assert q.where == Binary("=", AttrRef("a", "X"), AttrRef("A", "x"))


def test_units_and_names_do_not_clash():
    q = one("PATTERN SEQ(Smoke s, Heat min, Humidity h, Light ms) WHERE s.x < min.x "
            "WITHIN 5 min RETURN h, ms.level")
    assert [i.var for i in q.pattern.items] == ["s", "min", "h", "ms"]
    assert q.within.ms == 300_000


def test_negation_of_a_sub_pattern():
    q = one("PATTERN SEQ(A a, NOT (AND(B b, C c)), D d) WHERE b.v > a.v WITHIN 10")
    neg = q.pattern.items[1]
    assert neg == Negation(Operator("AND", (EventPattern("B", "b"), EventPattern("C", "c"))))


def test_nested_operators():
    q = one("PATTERN OR(SEQ(A a, AND(B b, C c)), AND(D d, SEQ(E e, NOT F f, G g))) WITHIN 1")
    assert q.pattern.op == "OR"
    assert q.pattern.items[1].items[1].items[1] == Negation(EventPattern("F", "f"))


def test_expression_precedence_and_literals():
    q = one("PATTERN A a WHERE a.x + 2 * -a.y >= 3.25 OR NOT a.s = 'it''s' AND a.b != true "
            "WITHIN 1")
    lhs = Binary("+", AttrRef("a", "x"), Binary("*", Number(2), Unary("-", AttrRef("a", "y"))))
    assert q.where == Binary("OR", Binary(">=", lhs, Number(3.25)),
                             Binary("AND", Unary("NOT", Binary("=", AttrRef("a", "s"),
                                                               String("it's"))),
                                    Binary("!=", AttrRef("a", "b"), Boolean(True))))
    assert isinstance(one("PATTERN A a WHERE a.x = 3 WITHIN 1").where.right.value, int)
    assert isinstance(one("PATTERN A a WHERE a.x = 3.0 WITHIN 1").where.right.value, float)


def test_division_is_left_associative():
    q = one("PATTERN A a WHERE a.x / 2 / 4 < 1 - 2 - 3 WITHIN 1")
    assert q.where.left == Binary("/", Binary("/", AttrRef("a", "x"), Number(2)), Number(4))
    assert q.where.right == Binary("-", Binary("-", Number(1), Number(2)), Number(3))


def test_conjunct_splitting_follows_the_spec():
    q = one("PATTERN SEQ(A a, B b) WHERE (a.x = 1 AND (b.y = 2 AND a.z = 3)) AND "
            "(a.x = 1 OR b.y = 2) AND NOT (a.x = 1 AND b.y = 2) WITHIN 1")
    parts = conjuncts(q.where)
    assert len(parts) == 5
    assert parts[3].op == "OR" and parts[4].op == "NOT"


def test_positions_are_recorded():
    q = one("\n  PATTERN SEQ(A a,\n    B b) WHERE a.x > 1 WITHIN 1")
    assert (q.pos.line, q.pos.col) == (2, 3)
    assert (q.pattern.items[1].pos.line, q.pattern.items[1].pos.col) == (3, 5)
    assert (q.where.pos.line, q.where.pos.col) == (3, 20)  # the '>' operator


def test_parse_file(tmp_path):
    p = tmp_path / "q.cep"
    p.write_text(FIRE)
    assert parse_file(p).queries[0].name == "fire"
    p.write_text("PATTERN SEQ(A a, B b)\n")
    with pytest.raises(QueryError) as err:
        parse_file(p)
    assert str(err.value).startswith(f"{p}:1:22: missing WITHIN")
    from dqcep.core.errors import UserError
    with pytest.raises(UserError) as err:  # no position: the file is missing, not a query
        parse_file(tmp_path / "missing.cep")
    assert str(err.value) == (f"cannot read query file {tmp_path / 'missing.cep'}: "
                              "No such file or directory")
    p.write_bytes(b"PATTERN A \xff WITHIN 1")
    with pytest.raises(QueryError, match="not UTF-8"):
        parse_file(p)


# ---------------------------------------------------------------------- errors

ERRORS = [
    # (query text, line, col, fragment of the message)
    ("PATTERN SEQ(A a B b) WITHIN 5", 1, 17, "unexpected name 'B'; expected ','"),
    ("PATTERN SEQ(A a, B b)\nWHERE a.x > 1", 2, 14, "missing WITHIN"),
    ("PATTERN SEQ(A a, B b);\nPATTERN A c WITHIN 1", 1, 22, "missing WITHIN"),
    ("PATTERN A a WITHIN 5.5 s", 1, 21, "expected one of ';', AFTER MATCH, RETURN, USING, a time unit"),
    ("PATTERN A a WITHIN -5", 1, 20, "unexpected '-'; expected an integer"),
    ("PATTERN SEQ(A a) WITHIN 5", 1, 16, "expected ','"),
    ("PATTERN", 1, 8, "unexpected end of input; expected one of AND, OR, SEQ, a name"),
    ("", 1, 1, "the file holds no query"),
    ("PATTERN A a WHERE a.x # 5 WITHIN 1", 1, 23, "unexpected character '#'"),
    ("PATTERN A a WHERE a.s = 'abc WITHIN 1", 1, 25, "unterminated string"),
    ("PATTERN SEQ(A and, B b) WITHIN 1", 1, 15, "'and' is a reserved word"),
    ("PATTERN SEQ(A a, B b) WITHIN 1 RETURN not", 1, 39, "'not' is a reserved word"),
    # semantic errors
    ("PATTERN SEQ(A a, B b)\n  WHERE c.x > 5 WITHIN 5", 2, 9, "unknown variable 'c'; the pattern binds a, b"),
    ("PATTERN SEQ(A a, B b) WITHIN 5 RETURN a.x, c", 1, 44, "unknown variable 'c' in RETURN"),
    ("PATTERN SEQ(A a, NOT B b) WITHIN 5 RETURN b", 1, 43, "it is negated"),
    ("PATTERN SEQ(A a, B b) WITHIN 5 RETURN a, a", 1, 42, "RETURN lists a twice"),
    ("PATTERN SEQ(A a,\n  AND(B b, C a)) WITHIN 5", 2, 12, "variable 'a' is bound twice (first at line 1, column 13)"),
    ("PATTERN SEQ(A a, NOT B a) WITHIN 5", 1, 22, "variable 'a' is bound twice"),
    ("PATTERN OR(A a, NOT B b) WITHIN 5", 1, 17, "NOT is allowed only as an item of SEQ or AND"),
    ("PATTERN SEQ(A a, NOT (SEQ(B b, NOT C c))) WITHIN 5", 1, 32, "NOT inside a negated pattern"),
    ("PATTERN AND(NOT A a, NOT B b) WITHIN 5", 1, 9, "AND needs at least one item that is not negated"),
    ("PATTERN A a WHERE a.x > 'abc' WITHIN 1", 1, 23, "type mismatch: '>' compares numbers only, got a string"),
    ("PATTERN A a WHERE (a.x > 1) = 5 WITHIN 1", 1, 29, "'=' compares a boolean with a number"),
    ("PATTERN A a WHERE 'x' = 5 WITHIN 1", 1, 23, "'=' compares a string with a number"),
    ("PATTERN A a WHERE a.s + 'x' = 'y' WITHIN 1", 1, 23, "'+' needs numbers, got a string"),
    ("PATTERN A a WHERE NOT 5 WITHIN 1", 1, 19, "NOT needs a boolean, got a number"),
    ("PATTERN A a WHERE a.x > 1 AND 7 WITHIN 1", 1, 27, "AND needs booleans, got a number"),
    ("PATTERN A a WHERE -true WITHIN 1", 1, 19, "unary '-' needs a number"),
    ("PATTERN A a WHERE a.x + 1 WITHIN 1", 1, 23, "WHERE needs a boolean condition, this is a number"),
    ("PATTERN A a WHERE a.ts = 'x' WITHIN 1", 1, 24, "'=' compares a number with a string"),
    ("QUERY x PATTERN A a WITHIN 1;\nQUERY x PATTERN A a WITHIN 1", 2, 1, "duplicate query name 'x'"),
    ("QUERY q2 PATTERN A a WITHIN 1; PATTERN A a WITHIN 1", 1, 32, "duplicate query name 'q2'"),
    ("PATTERN A a WHERE a.x = 1" + "0" * 400 + " WITHIN 1", 1, 25, "is too large"),
    ("PATTERN A a WITHIN 99999999999999999999 h", 1, 20, "window of 99999999999999999999 h is too large"),
    # section 5: Kleene closure, aggregates, strategies
    ("PATTERN AND(A+ a[], B b) WITHIN 5", 1, 13, "Kleene item (Type+ v[]) is allowed only as an item of SEQ, not in AND"),
    ("PATTERN OR(A a, B+ b[]) WITHIN 5", 1, 17, "only as an item of SEQ, not in OR"),
    ("PATTERN A+ a[] WITHIN 5", 1, 9, "only as an item of SEQ, not on its own"),
    ("PATTERN SEQ(A a, NOT B+ b[], C c) WITHIN 5", 1, 18, "a Kleene item (Type+ v[]) cannot be negated"),
    ("PATTERN SEQ(A a, NOT (SEQ(B+ b[], C c))) WITHIN 5", 1, 27, "cannot stand inside a negated pattern"),
    ("PATTERN SEQ(A a, B b)\nWHERE a[i].x > 1 WITHIN 5", 2, 7, "a[i].x: a is not a Kleene variable"),
    ("PATTERN SEQ(A a, B b) WHERE max(b.x) > 1 WITHIN 5", 1, 29, "max(b.x): b is not a Kleene variable"),
    ("PATTERN SEQ(A+ a[], B b) WHERE count(a.x) > 1 WITHIN 5", 1, 32, "count takes the variable: count(a)"),
    ("PATTERN SEQ(A+ a[], B b) WHERE avg(a) > 1 WITHIN 5", 1, 32, "avg needs an attribute: avg(a.attr)"),
    ("PATTERN SEQ(A+ a[], B b) WHERE a[2].x > 1 WITHIN 5", 1, 34, "index [2] is not supported"),
    ("PATTERN SEQ(A+ a[], B b) WHERE a[j].x > 1 WITHIN 5", 1, 34, "index [j] is not supported"),
    ("PATTERN SEQ(A+ a[], B b) WHERE median(a.x) > 1 WITHIN 5", 1, 32, "unknown function 'median'"),
    ("PATTERN SEQ(A+ a[], B b) WHERE count(a) > 'x' WITHIN 5", 1, 41, "'>' compares numbers only, got a string"),
    ("PATTERN SEQ(A+ a[], B b) WITHIN 5 RETURN a.x", 1, 42, "RETURN a.x: a is a Kleene variable"),
    ("PATTERN SEQ(A a, B b) WITHIN 5 RETURN sum(a.x)", 1, 39, "sum(a.x): a is not a Kleene variable"),
    ("PATTERN SEQ(A+ a[], B b) WITHIN 5 RETURN count(a), count(a)", 1, 52, "RETURN lists count(a) twice"),
    ("PATTERN AND(A a, B b) WITHIN 5 USING skip-till-next-match", 1, 9, "needs a single event or a SEQ of events, Kleene items and negations, not AND"),
    ("PATTERN SEQ(A a, OR(B b, C c)) WITHIN 5 USING skip-till-next-match", 1, 18, "OR is not allowed in it"),
    ("PATTERN SEQ(A a, SEQ(B b, C c)) WITHIN 5 USING strict-contiguity", 1, 18, "a nested SEQ is not allowed in it"),
    ("PATTERN SEQ(A a, NOT (AND(B b, C c)), D d) WITHIN 5 USING skip-till-next-match", 1, 23, "AND is not allowed in it"),
    ("PATTERN SEQ(A a, NOT B b, C c) WITHIN 5 USING strict-contiguity", 1, 18, "NOT is not allowed under USING strict-contiguity"),
    ("PATTERN SEQ(A a, C c, NOT B b) WHERE [x] WITHIN 5\n  USING partition-contiguity", 1, 23, "NOT is not allowed under USING partition-contiguity"),
    ("PATTERN SEQ(A a, B b) WHERE a.x = b.x WITHIN 5\n  USING partition-contiguity", 2, 9, "needs a top-level [attr] in WHERE"),
    ("PATTERN SEQ(A a, B b) WITHIN 5 USING skip-till-last-match", 1, 38, "expected a strategy (skip-till-any-match"),
]


@pytest.mark.parametrize("text,line,col,fragment", ERRORS, ids=[e[3][:40] for e in ERRORS])
def test_error_positions_and_messages(text, line, col, fragment):
    with pytest.raises(QueryError) as info:
        parse(text, "bad.cep")
    err = info.value
    assert fragment in err.message
    assert (err.line, err.col) == (line, col)
    rendered = str(err).splitlines()
    assert rendered[0] == f"bad.cep:{line}:{col}: {err.message}"
    if len(rendered) > 1:  # the offending line, then a caret under the column
        assert rendered[1] == "    " + text.split("\n")[line - 1]
        assert rendered[2] == "    " + " " * (col - 1) + "^"


def test_error_caret_keeps_tabs():
    with pytest.raises(QueryError) as info:
        parse("\tPATTERN A a WHERE\tz.x > 1 WITHIN 1")
    assert str(info.value).splitlines()[2] == "    \t" + " " * len("PATTERN A a WHERE") + "\t^"


# ------------------------------------------------------------------ round trip


def test_printer_never_writes_a_comment_marker():
    q = one("PATTERN A a WHERE 0 = -(-a.p) AND a.x - -1 > 0 WITHIN 1")
    text = to_source(q)
    assert "--" not in text
    assert one(text) == q


@settings(max_examples=examples(400), suppress_health_check=[HealthCheck.too_slow])
@given(queries(), st.sampled_from([None, *ast.POLICIES]))
def test_round_trip_query(q, policy):
    q = dataclasses.replace(q, after_match=policy)
    text = to_source(q)
    assert one(text) == q, text


@settings(max_examples=examples(100), suppress_health_check=[HealthCheck.too_slow])
@given(query_files())
def test_round_trip_file(f):
    again = parse(file_to_source(f))
    assert again.queries == f.queries


def test_kleene_items_references_aggregates_and_strategies():
    q = one("""QUERY rising
    PATTERN SEQ(Temperature+ t[], NOT Rain r, Smoke s)
    WHERE [room] AND t[i].value > t[i-1].value AND t.value > 20 AND t[1].value < 30
      AND t[LAST].value >= 40 AND count(t) >= 3 AND AVG(t.value) < s.density
    WITHIN 1 min using SKIP-TILL-NEXT-MATCH
    RETURN t, count(t), max(t.value), s.density""")
    seq = q.pattern
    assert seq.items[0] == Kleene("Temperature", "t")
    assert q.strategy == "skip-till-next-match"
    refs = [e for c in conjuncts(q.where) for e in walk_expr(c)
            if isinstance(e, (AttrRef, Aggregate))]
    assert [getattr(r, "index", None) for r in refs if isinstance(r, AttrRef)] == [
        "i", "i-1", None, "1", "last", None]
    assert [r for r in refs if isinstance(r, Aggregate)] == [
        Aggregate("count", "t", None), Aggregate("avg", "t", "value")]
    assert [r.label for r in q.returns] == ["t", "count(t)", "max(t.value)", "s.density"]
    assert kleene_vars(q.pattern) == {"t"} and positive_vars(q.pattern) == ["t", "s"]
    assert one(to_source(q)) == q
    # the default strategy is printed only when it is not the default
    assert "USING" not in to_source(one("PATTERN SEQ(A a, B b) WITHIN 5 USING skip-till-any-match"))
    # units, USING and function names stay usable as names
    q = one("PATTERN SEQ(count using, max+ s[]) WHERE [k] AND max(s.x) > using.x WITHIN 5 s "
            "USING partition-contiguity RETURN using")
    assert q.strategy == "partition-contiguity" and one(to_source(q)) == q


# --------------------------------------------------------------------- fuzzing
# The only outcomes of parse() are a query file or a positioned QueryError.

VOCAB = ["QUERY", "PATTERN", "WHERE", "WITHIN", "RETURN", "SEQ", "AND", "OR", "NOT", "true",
         "false", "(", ")", "[", "]", ",", ";", ".", "=", "!=", "<", "<=", ">", ">=", "+", "-",
         "*", "/", "A", "B", "a", "b", "x", "s", "min", "ms", "h", "0", "17", "3.5", "'s'",
         "'", "--", "\n", "#", "''", "1e5", "é", "\t", "+", "[]", "USING",
         "skip-till-next-match", "partition-contiguity", "count", "avg", "i", "i-1", "last"]


def parse_or_positioned_error(text):
    try:
        parse(text, "fuzz.cep")
    except QueryError as err:
        assert err.line >= 1 and err.col >= 1, err
        assert str(err).startswith(f"fuzz.cep:{err.line}:{err.col}: ")


@settings(max_examples=examples(1500), deadline=None)
@given(st.text(max_size=120))
def test_fuzz_random_text(text):
    parse_or_positioned_error(text)


@settings(max_examples=examples(2000), deadline=None)
@given(st.lists(st.sampled_from(VOCAB), max_size=40), st.sampled_from([" ", ""]))
def test_fuzz_token_soup(tokens, sep):
    parse_or_positioned_error(sep.join(tokens))


@st.composite
def mutated_queries(draw):
    text = to_source(draw(queries(max_depth=2)))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 8)))
        kind = draw(st.integers(0, 3))
        if kind == 0:
            text = text[:i] + text[j:]
        elif kind == 1:
            text = text[:i] + draw(st.sampled_from(VOCAB)) + text[i:]
        elif kind == 2:
            text = text[:i] + text[i:j] + text[i:]
        else:
            text = text[:i] + text[j:i + 2 * (j - i)] + text[i:j] + text[i + 2 * (j - i):]
    return text


@settings(max_examples=examples(2000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_queries())
def test_fuzz_mutated_valid_queries(text):
    parse_or_positioned_error(text)


def test_nesting_limit_is_a_positioned_error():
    deep = "PATTERN A a WHERE " + "(" * 300 + "a.x > 1" + ")" * 300 + " WITHIN 1"
    with pytest.raises(QueryError, match="nested more than 200 levels deep") as info:
        parse(deep)
    assert info.value.line == 1 and info.value.col > 200
    ok = "PATTERN A a WHERE " + "(" * 150 + "a.x > 1" + ")" * 150 + " WITHIN 1"
    assert parse(ok).queries[0].where.op == ">"


# --------------------------------------------- hostile queries, parsed, planned and run
HOSTILE_EVENTS = [{"id": i, "type": t, "ts": ts, "x": x, "y": 2.5, "room": "r"}
                  for i, (t, ts, x) in enumerate([("A", 1, 1), ("B", 2, -3), ("A", 3, 7),
                                                  ("C", 4, 0), ("B", 5, 2), ("A", 6, 1)], 1)]


def planned_and_run_or_positioned_error(text):
    """The whole path of a query file: a positioned QueryError, or a plan whose native
    run gives exactly the reference's matches on a small stream."""
    from dqcep.core.events import event_from_mapping
    from dqcep.plan import build_plan
    from dqcep.baseline.reference import ReferenceMatcher
    from dqcep.runtime import Engine
    try:
        qf = parse(text, "hostile.cep")
    except QueryError as err:
        assert err.line >= 1 and err.col >= 1, err
        assert str(err).startswith(f"hostile.cep:{err.line}:{err.col}: ")
        return None
    events = [event_from_mapping(e) for e in HOSTILE_EVENTS]
    engine = Engine(build_plan(qf.queries))
    got = engine.process(events).to_matches() + engine.flush().to_matches()
    want = ReferenceMatcher(qf.queries).run(events)
    from collections import Counter
    assert Counter(m.key for m in got) == Counter(m.key for m in want)
    return qf


def wide(op, n, typ="A"):
    return f"{op}(" + ", ".join(f"{typ} v{i}" for i in range(n)) + ")"


@pytest.mark.parametrize("pattern, where, within, refused", ids=lambda v: str(v)[:40], argvalues=[
    (wide("AND", 9), None, "1 s", None),                            # was a TypeError
    (wide("AND", 12, "B"), "[room]", "1 s", None),
    ("SEQ(A a, B b)", "[ts]", "1 s", "[ts] is not supported"),       # was a KeyError
    ("SEQ(A a, B b)", "[id]", "1 s", "[id] is not supported"),
    ("SEQ(A a, B b)", "[type]", "1 s", "[type]"),
    ("SEQ(A a, B b)", "a.type = 'A'", "1 s", "a.type"),
    (wide("OR", 1000), None, "1 s", None),                         # was a RecursionError
    ("SEQ(A a, B b)", "a.x < " + " + ".join(["b.y"] * 1000), "1 s", "nested more than"),
    ("SEQ(A a, B b)", "a.x < " + " + ".join(["b.y"] * 150), "1 s", None),
    ("SEQ(A a, B b)", " AND ".join(["a.x > -5"] * 1000), "1 s", "nested more than"),
    (wide("SEQ", 180), None, "1 s", None),                          # was an OverflowError
    (wide("SEQ", 250), None, "1 s", "decomposes more than 200"),
    (wide("AND", 1000), None, "1 s", "decomposes more than 200"),
    ("SEQ(A a, B b)", None, "4611686018427387904", "too large"),    # was an OverflowError
    ("SEQ(A a, B b)", None, "1152921504606846976", None),           # 2**60 ms: the largest
    ("SEQ(A a, B b)", None, "9223372036854775807 h", "too large"),
    ("SEQ(A a, B b)", "a.x < 1" + "0" * 400, "1 s", "too large"),
    ("SEQ(A a, B b)", "a.x < 1" + "0" * 300, "1 s", None),
    ("SEQ(A a, B b)", "a.ts < b.ts AND a.id < b.id", "1 s", None),
])
def test_hostile_queries_run_correctly_or_are_refused_with_a_position(pattern, where, within,
                                                                      refused):
    text = f"QUERY q\nPATTERN {pattern}\n" + (f"WHERE {where}\n" if where else "") + \
        f"WITHIN {within}\n"
    if refused is None:
        assert planned_and_run_or_positioned_error(text) is not None
    else:
        with pytest.raises(QueryError, match=re.escape(refused)):
            parse(text, "hostile.cep")


RESERVED_ATTRS = ["ts", "id", "type", "x", "y", "room", "missing"]


@st.composite
def hostile_texts(draw):
    """Wide and deep patterns, long operator chains, huge numbers, reserved names."""
    width = draw(st.one_of(st.integers(2, 6), st.integers(150, 260)))
    op = draw(st.sampled_from(["SEQ", "AND", "OR"]))
    types = st.sampled_from(["A", "B", "C"])
    names = iter(f"v{i}" for i in range(10_000))
    pattern = f"{op}(" + ", ".join(f"{draw(types)} {next(names)}" for _ in range(width)) + ")"
    for _ in range(draw(st.one_of(st.just(0), st.integers(1, 3), st.integers(95, 110)))):
        pattern = f"{draw(st.sampled_from(['SEQ', 'AND', 'OR']))}({draw(types)} " \
                  f"{next(names)}, {pattern})"
    var = "v0"
    number = draw(st.one_of(st.integers(-10, 10).map(str),
                            st.integers(0, 400).map(lambda k: "9" * max(k, 1)),
                            st.builds(lambda a, b: f"{a}.{b}", st.integers(0, 10**6),
                                      st.integers(0, 10**6))))
    term = f"{var}.{draw(st.sampled_from(RESERVED_ATTRS))}"
    chain = draw(st.one_of(st.integers(1, 5), st.integers(190, 260)))
    joiner = draw(st.sampled_from([" + ", " - ", " * ", " / "]))
    where = draw(st.sampled_from([
        f"{term} < " + joiner.join([number] * chain),
        " AND ".join([f"{term} > {number}"] * chain),
        " OR ".join([f"{term} = {number}"] * chain),
        f"[{draw(st.sampled_from(RESERVED_ATTRS))}]",
        "NOT " * chain + f"{term} > 0"]))
    within = draw(st.one_of(st.integers(0, 10**4), st.integers(2**59, 2**64)))
    unit = draw(st.sampled_from(["", " ms", " s", " min", " h"]))
    return f"QUERY q\nPATTERN {pattern}\nWHERE {where}\nWITHIN {within}{unit}\n"


@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile_texts())
def test_fuzz_wide_and_deep_queries_run_or_are_refused(text):
    planned_and_run_or_positioned_error(text)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kleene_queries())
def test_round_trip_kleene_queries(q):
    text = to_source(q)
    assert one(text) == q, text


# ------------------------------------------------------------------ event schemas

SCHEMA_FILE = """EVENT Temperature(room STRING, value DOUBLE, ok bool);
EVENT Smoke(room STRING, density DOUBLE, level INT);
QUERY fire PATTERN SEQ(Temperature+ t[], Smoke s) WHERE [room] AND t[i].value > t[i-1].value
AND avg(t.value) > 30 AND s.level >= 2 AND t[last].ok WITHIN 1 min RETURN s.density;
QUERY open PATTERN SEQ(Event event, Door d) WHERE event.x = d.open AND d.anything = 'x'
WITHIN 1 s"""


def test_event_schemas_parse_print_and_round_trip():
    f = parse(SCHEMA_FILE)
    assert [s.type for s in f.schemas] == ["Temperature", "Smoke"]
    assert f.schema_of("Temperature").attr_type("ok") == "BOOL"   # type names ignore case
    assert f.schema_of("Smoke").attr_type("level") == "INT"
    assert f.schema_of("Door") is None                             # schemaless
    assert f.queries[1].pattern.items[0].type == "Event"           # EVENT only starts one
    text = file_to_source(f)
    assert text.startswith("EVENT Temperature(room STRING, value DOUBLE, ok BOOL);\n")
    assert parse(text) == f


@pytest.mark.parametrize("text, message, line, col", [
    ("EVENT T(a INTEGER); PATTERN T t WITHIN 1 s",
     "unknown attribute type 'INTEGER'; the types are INT, DOUBLE, STRING, BOOL", 1, 11),
    ("EVENT T(a INT, a BOOL); PATTERN T t WITHIN 1 s",
     "attribute 'a' is declared twice (first at line 1, column 9)", 1, 16),
    ("EVENT T(ts INT); PATTERN T t WITHIN 1 s",
     "'ts' is every event's own field, not an attribute to declare", 1, 9),
    ("EVENT T(a INT); EVENT T(b INT); PATTERN T t WITHIN 1 s",
     "event type 'T' is declared twice (first at line 1, column 1)", 1, 17),
    ("EVENT T(a INT);", "the file declares event types but holds no query", 1, 1),
    ("EVENT T(value DOUBLE);\nPATTERN SEQ(T t, U u) WHERE t.vaule > 3 AND u.vaule > 3 "
     "WITHIN 1 s", "t.vaule: T declares no attribute 'vaule' (it declares value; line 1)",
     2, 29),
    ("EVENT T(value DOUBLE, room STRING);\nPATTERN SEQ(T t, U u) WHERE t.room > 3 WITHIN 1 s",
     "type mismatch: '>' compares numbers only, got a string", 2, 36),
    ("EVENT T(room STRING);\nPATTERN SEQ(T t, U u) WHERE t.room = u.x AND t.room = 3 "
     "WITHIN 1 s", "type mismatch: '=' compares a string with a number", 2, 53),
    ("EVENT T(value DOUBLE);\nPATTERN SEQ(T t, U u) WHERE [room] WITHIN 1 s",
     "[room]: T declares no attribute 'room' (it declares value; line 1)", 2, 29),
    ("EVENT T(room STRING);\nPATTERN SEQ(T+ t[], U u) WHERE avg(t.room) > 1 WITHIN 1 s",
     "type mismatch: avg(t.room) needs numbers, t.room is declared STRING", 2, 32),
    ("EVENT T(value DOUBLE);\nPATTERN SEQ(T t, U u) WITHIN 1 s RETURN t.valu",
     "RETURN t.valu: T declares no attribute 'valu' (it declares value; line 1)", 2, 41),
    ("EVENT T(value DOUBLE);\nPATTERN SEQ(T t, NOT T n, U u) WHERE n.vaule > 1 WITHIN 1 s",
     "n.vaule: T declares no attribute 'vaule'", 2, 38),
])
def test_event_schemas_are_checked_with_positions(text, message, line, col):
    with pytest.raises(QueryError) as err:
        parse(text, "q.cep")
    assert message in str(err.value)
    assert str(err.value).startswith(f"q.cep:{line}:{col}: ")


def test_a_negated_type_needs_no_declared_equivalence_attribute():
    """[attr] constrains the bound positive variables only (spec): a negated type
    without the attribute is no error, and schemaless types are never checked."""
    parse("EVENT N(x INT);\nPATTERN SEQ(A a, NOT N n, B b) WHERE [room] AND a.q = 1 "
          "WITHIN 1 s")


@st.composite
def schemas_beside(draw, f: ast.QueryFile):
    """Event schemas for types no query of ``f`` uses (so ``f`` stays valid)."""
    used = {ev.type for q in f.queries for ev, _ in ast.event_patterns(q.pattern)}
    names = draw(st.lists(IDENT.filter(lambda t: t not in used), unique=True, max_size=3))
    out = []
    for t in names:
        attrs = draw(st.lists(IDENT.filter(lambda a: a not in ("ts", "id", "type")),
                              unique=True, min_size=1, max_size=4))
        out.append(ast.EventSchema(t, tuple(ast.SchemaAttr(
            a, draw(st.sampled_from(ast.ATTRIBUTE_TYPES))) for a in attrs)))
    return ast.QueryFile(f.source, f.queries, tuple(out))


@settings(max_examples=examples(100), suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_round_trip_file_with_schemas(data):
    f = data.draw(schemas_beside(data.draw(query_files())))
    assert parse(file_to_source(f), "<test>") == f


@settings(max_examples=examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(query_files(), st.data())
def test_a_schema_that_omits_a_read_attribute_is_an_error_there(f, data):
    """Declare a type of a valid file with every attribute the file reads of it but one
    that a condition reads: the file is refused, naming that one, at a reference to it
    (the declaration check comes before the type checks)."""
    parsed = parse(file_to_source(f))
    needed: dict[str, set[str]] = {}      # type -> every attribute the check requires
    in_where: dict[str, dict[str, set]] = {}  # type -> attribute -> positions read
    for q in parsed.queries:
        types = {ev.var: ev.type for ev, _ in ast.event_patterns(q.pattern)}
        positive = {ev.type for ev, neg in ast.event_patterns(q.pattern) if not neg}
        for e in ast.walk_expr(q.where) if q.where is not None else ():
            if isinstance(e, (ast.AttrRef, ast.Aggregate)) and e.attr not in (None, "ts", "id"):
                needed.setdefault(types[e.var], set()).add(e.attr)
                if isinstance(e, ast.AttrRef):
                    in_where.setdefault(types[e.var], {}).setdefault(e.attr, set()).add(e.pos)
            if isinstance(e, ast.Equivalence):
                for t in positive:
                    needed.setdefault(t, set()).add(e.attr)
        for r in q.returns:
            if r.attr is not None and r.attr not in ("ts", "id"):
                needed.setdefault(types[r.var], set()).add(r.attr)
    # read by the first query: the queries are checked in order, and one before it could
    # fail a type check against the DOUBLE declarations first (a.x = 'text')
    first = parsed.queries[0]
    types0 = {ev.var: ev.type for ev, _ in ast.event_patterns(first.pattern)}
    read0 = {(types0[e.var], e.attr) for e in (ast.walk_expr(first.where)
                                               if first.where is not None else ())
             if isinstance(e, ast.AttrRef)}
    candidates = sorted((t, a) for t, attrs in in_where.items() for a in attrs
                        if (t, a) in read0
                        and a not in {x.attr for q in parsed.queries if q.where is not None
                                      for x in ast.walk_expr(q.where)
                                      if isinstance(x, ast.Equivalence)})
    assume(candidates)
    etype, missing = data.draw(st.sampled_from(candidates))
    declared = sorted(needed[etype] - {missing}) or ["zz_pad"]
    text = f"EVENT {etype}(" + ", ".join(f"{a} DOUBLE" for a in declared) + ");\n" + \
        file_to_source(parsed)
    with pytest.raises(QueryError) as err:
        parse(text, "<test>")
    assert f"declares no attribute {missing!r}" in str(err.value)
    line, col = map(int, str(err.value).split(":")[1:3])
    assert ast.Pos(line - 1, col) in in_where[etype][missing]  # the schema adds a line


def test_after_match_policies_parse_print_and_refuse_with_positions():
    q = one("PATTERN SEQ(A a, B b) WITHIN 10 s USING skip-till-next-match\n"
            "  after  match skip PAST last event RETURN a")
    assert (q.after_match, q.strategy, q.after_match_pos) == (
        ast.SKIP_PAST_LAST, "skip-till-next-match", ast.Pos(2, 16))
    assert "WITHIN 10 s USING skip-till-next-match AFTER MATCH SKIP PAST LAST EVENT" in \
        to_source(q)
    assert one("PATTERN A a WITHIN 1 AFTER MATCH SKIP TO NEXT EVENT").after_match == \
        ast.SKIP_TO_NEXT
    assert one("PATTERN A a WITHIN 1").after_match is None
    # the words stay names elsewhere
    assert one("PATTERN SEQ(After after, Match match) WHERE after.skip > match.last "
               "WITHIN 1").after_match is None
    for text, where, message in [
        ("PATTERN A a WITHIN 1 AFTER MATCH", (1, 33), "AFTER MATCH needs a policy, got end"),
        ("PATTERN A a WITHIN 1 AFTER MATCH SKIP BACK", (1, 34),
         "AFTER MATCH needs a policy, got 'SKIP BACK': SKIP PAST LAST EVENT or SKIP TO NEXT"),
        ("PATTERN A a WITHIN 1 AFTER MATCH; ", (1, 33), "AFTER MATCH needs a policy, got ';'"),
        ("PATTERN A a WITHIN 1 AFTER MATCH SKIP TO NEXT EVENT AFTER MATCH SKIP TO NEXT EVENT",
         (1, 53), "AFTER MATCH twice"),
        ("PATTERN A a AFTER MATCH SKIP TO NEXT EVENT WITHIN 1", (1, 13),
         "AFTER MATCH comes after WITHIN"),
        ("PATTERN A a WHERE a.x > 1 AFTER MATCH SKIP TO NEXT EVENT WITHIN 1", (1, 27),
         "AFTER MATCH comes after WITHIN"),
    ]:
        with pytest.raises(QueryError) as err:
            parse(text)
        assert (err.value.line, err.value.col) == where and message in str(err.value), \
            (text, str(err.value))
