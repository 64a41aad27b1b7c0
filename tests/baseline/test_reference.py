"""Reference matcher: hand-checked cases for every rule of spec sections 3, 4 and 5."""
import dataclasses
import time

from hypothesis import HealthCheck, given, settings

from dqcep.core.events import Event
from dqcep.lang import parse
from dqcep.baseline.reference import ReferenceMatcher
from tests.support.strategies import kleene_event_streams, kleene_queries
from tests.support.examples import examples


def ev(id, type, ts, **attrs):
    return Event(id, type, ts, attrs)


def run(text, events):
    """{(query, ((var, id), ...), detected_at)} for all matches."""
    ms = ReferenceMatcher(parse(text).queries).run(events)
    out = [(m.query, m.events, m.detected_at) for m in ms]
    assert len(set(out)) == len(out)
    return set(out)


def ids(text, events):
    """Matches as a set of {var: id} tuples, ignoring query and detected_at."""
    return {e for _, e, _ in run(text, events)}


A1, A2, B1, B2, C1 = ev(1, "A", 10), ev(2, "A", 20), ev(3, "B", 30), ev(4, "B", 40), ev(5, "C", 50)


# ---------------------------------------------------------------- SEQ, window


def test_seq_skip_till_any_match_takes_every_combination():
    assert ids("PATTERN SEQ(A a, B b) WITHIN 100", [A1, A2, B1, B2]) == {
        (("a", 1), ("b", 3)), (("a", 1), ("b", 4)), (("a", 2), ("b", 3)), (("a", 2), ("b", 4))}


def test_seq_needs_strictly_increasing_ts():
    es = [ev(1, "A", 10), ev(2, "B", 10), ev(3, "B", 11)]
    assert ids("PATTERN SEQ(A a, B b) WITHIN 100", es) == {(("a", 1), ("b", 3))}
    assert ids("PATTERN SEQ(B b, A a) WITHIN 100", es) == set()


def test_seq_order_is_between_whole_items():
    # SEQ(AND(A,B), C): both A and B must precede C; A and B may come in any order.
    es = [ev(1, "B", 5), ev(2, "A", 6), ev(3, "C", 7), ev(4, "A", 8)]
    assert ids("PATTERN SEQ(AND(A a, B b), C c) WITHIN 100", es) == {
        (("a", 2), ("b", 1), ("c", 3))}


def test_window_is_inclusive():
    es = [ev(1, "A", 0), ev(2, "B", 100), ev(3, "B", 101)]
    assert ids("PATTERN SEQ(A a, B b) WITHIN 100 ms", es) == {(("a", 1), ("b", 2))}
    assert ids("PATTERN SEQ(A a, B b) WITHIN 0", es) == set()
    assert ids("PATTERN AND(A a, B b) WITHIN 0", [ev(1, "A", 5), ev(2, "B", 5)]) == {
        (("a", 1), ("b", 2))}


def test_window_units():
    es = [ev(1, "A", 0), ev(2, "B", 1000)]
    assert ids("PATTERN SEQ(A a, B b) WITHIN 1 s", es)
    assert not ids("PATTERN SEQ(A a, B b) WITHIN 999 ms", es)
    assert ids("PATTERN SEQ(A a, B b) WITHIN 1 min", [ev(1, "A", 0), ev(2, "B", 60_000)])
    assert ids("PATTERN SEQ(A a, B b) WITHIN 1 h", [ev(1, "A", 0), ev(2, "B", 3_600_000)])


def test_window_spans_all_bound_events_of_nested_patterns():
    es = [ev(1, "A", 0), ev(2, "B", 60), ev(3, "C", 120)]
    assert not ids("PATTERN SEQ(A a, SEQ(B b, C c)) WITHIN 100", es)
    assert ids("PATTERN SEQ(A a, SEQ(B b, C c)) WITHIN 120", es)


# --------------------------------------------------------------------- AND, OR


def test_and_any_order_equal_ts_allowed_disjoint_events():
    es = [ev(1, "A", 10), ev(2, "B", 10), ev(3, "A", 5)]
    assert ids("PATTERN AND(A a, B b) WITHIN 100", es) == {
        (("a", 1), ("b", 2)), (("a", 3), ("b", 2))}
    # the same event never binds two variables
    assert ids("PATTERN AND(A x, A y) WITHIN 100", [ev(1, "A", 10), ev(2, "A", 12)]) == {
        (("x", 1), ("y", 2)), (("x", 2), ("y", 1))}
    assert ids("PATTERN AND(A x, A y) WITHIN 100", [ev(1, "A", 10)]) == set()


def test_or_branches_are_different_matches():
    es = [ev(1, "A", 10)]
    assert ids("PATTERN OR(A x, A y) WITHIN 10", es) == {(("x", 1),), (("y", 1),)}
    assert ids("PATTERN SEQ(OR(A a, B b), C c) WITHIN 100", [A1, B1, C1]) == {
        (("a", 1), ("c", 5)), (("b", 3), ("c", 5))}


def test_or_conjunct_naming_an_unbound_variable_is_ignored():
    es = [ev(1, "A", 10, v=1), ev(2, "B", 20, v=100), ev(3, "C", 30, v=5)]
    q = "PATTERN SEQ(OR(A a, B b), C c) WHERE b.v < c.v AND a.v > 0 WITHIN 100"
    # a-branch: b.v < c.v ignored (b unbound), a.v > 0 holds.
    # b-branch: 100 < 5 fails.
    assert ids(q, es) == {(("a", 1), ("c", 3))}


# ------------------------------------------------------------------------ WHERE


def test_where_single_and_multi_variable_conjuncts():
    es = [ev(1, "A", 1, x=5), ev(2, "A", 2, x=50), ev(3, "B", 3, x=10), ev(4, "B", 4, x=60)]
    assert ids("PATTERN SEQ(A a, B b) WHERE a.x > 1 AND b.x > a.x WITHIN 10", es) == {
        (("a", 1), ("b", 3)), (("a", 1), ("b", 4)), (("a", 2), ("b", 4))}
    assert ids("PATTERN SEQ(A a, B b) WHERE b.x - a.x = 10 * 1 WITHIN 10", es) == {
        (("a", 2), ("b", 4))}


def test_arithmetic_is_floating_and_int_equals_float():
    es = [ev(1, "A", 1, x=7), ev(2, "B", 2, y=3.5)]
    assert ids("PATTERN SEQ(A a, B b) WHERE a.x / 2 = b.y WITHIN 10", es)
    assert ids("PATTERN SEQ(A a, B b) WHERE a.x = 7.0 AND -b.y < 0 WITHIN 10", es)


def test_failing_conjunct_is_false():
    es = [ev(1, "A", 1, x=0, s="abc", f=True), ev(2, "B", 2, x=1)]
    base = "PATTERN SEQ(A a, B b) WHERE {} WITHIN 10"
    assert not ids(base.format("b.x / a.x > 0"), es)         # division by zero
    assert not ids(base.format("a.missing = 1 OR b.x = 1"), es)  # missing attr, no short-circuit
    assert not ids(base.format("a.s = b.x"), es)             # different types
    assert not ids(base.format("NOT (a.s = b.x)"), es)       # failure is not negated
    assert not ids(base.format("a.s < b.x"), es)             # ordering on a string
    assert not ids(base.format("a.f <= a.f"), es)            # booleans: only = and !=
    assert not ids(base.format("a.s"), es)                   # non-boolean conjunct
    assert ids(base.format("a.f = true AND a.f != false AND a.s = 'abc'"), es)
    assert ids(base.format("a.f"), es)                       # a boolean attribute


def test_ts_and_id_are_attributes():
    es = [ev(1, "A", 10), ev(2, "B", 25), ev(3, "B", 12)]
    assert ids("PATTERN SEQ(A a, B b) WHERE b.ts - a.ts > 5 AND b.id > a.id WITHIN 100",
               es) == {(("a", 1), ("b", 2))}


def test_constant_conjunct_evaluated_once():
    es = [ev(1, "A", 1)]
    assert ids("PATTERN A a WHERE 1 < 2 WITHIN 1", es)
    assert not ids("PATTERN A a WHERE 1 > 2 WITHIN 1", es)
    assert not ids("PATTERN A a WHERE 1 / 0 = 1 WITHIN 1", es)


def test_equivalence_over_bound_positive_variables():
    es = [ev(1, "A", 1, room="r1"), ev(2, "B", 2, room="r1"), ev(3, "B", 3, room="r2"),
          ev(4, "B", 4)]
    assert ids("PATTERN SEQ(A a, B b) WHERE [room] WITHIN 10", es) == {(("a", 1), ("b", 2))}
    # numbers: 1 and 1.0 are the same value
    es2 = [ev(1, "A", 1, k=1), ev(2, "B", 2, k=1.0), ev(3, "B", 3, k="1")]
    assert ids("PATTERN SEQ(A a, B b) WHERE [k] WITHIN 10", es2) == {(("a", 1), ("b", 2))}


def test_equivalence_with_or_uses_the_taken_branch_only():
    es = [ev(1, "A", 1, room="r1"), ev(2, "B", 2, room="r2"), ev(3, "C", 3, room="r1")]
    assert ids("PATTERN SEQ(OR(A a, B b), C c) WHERE [room] WITHIN 10", es) == {
        (("a", 1), ("c", 3))}


def test_equivalence_nested_in_an_expression():
    es = [ev(1, "A", 1, room="r1", x=1), ev(2, "B", 2, room="r2", x=9)]
    assert ids("PATTERN SEQ(A a, B b) WHERE [room] OR b.x > 5 WITHIN 10", es)
    assert not ids("PATTERN SEQ(A a, B b) WHERE [room] OR b.x > 50 WITHIN 10", es)
    assert ids("PATTERN SEQ(A a, B b) WHERE NOT [room] WITHIN 10", es)


# ---------------------------------------------------------------------- NOT


def test_not_in_the_middle_is_exclusive_at_both_ends():
    q = "PATTERN SEQ(A a, NOT N n, B b) WITHIN 100"
    assert not ids(q, [ev(1, "A", 10), ev(2, "N", 15), ev(3, "B", 20)])
    assert ids(q, [ev(1, "A", 10), ev(2, "N", 10), ev(3, "B", 20)])
    assert ids(q, [ev(1, "A", 10), ev(2, "N", 20), ev(3, "B", 20)])


def test_not_only_blocks_the_matches_whose_gap_it_falls_in():
    es = [ev(1, "A", 10), ev(2, "N", 15), ev(3, "A", 16), ev(4, "B", 20)]
    assert ids("PATTERN SEQ(A a, NOT N n, B b) WITHIN 100", es) == {(("a", 3), ("b", 4))}


def test_not_conjuncts_that_mention_the_negated_variable():
    q = "PATTERN SEQ(A a, NOT N n, B b) WHERE n.v > a.v AND a.v > 0 WITHIN 100"
    es = [ev(1, "A", 10, v=5), ev(2, "N", 15, v=3), ev(3, "B", 20)]
    assert ids(q, es)  # the N does not satisfy n.v > a.v, so it does not block
    es[1] = ev(2, "N", 15, v=9)
    assert not ids(q, es)
    # an N lacking the attribute cannot satisfy the conjunct: no block
    assert ids(q, [ev(1, "A", 10, v=5), ev(2, "N", 15), ev(3, "B", 20)])


def test_several_nots_in_one_gap():
    q = "PATTERN SEQ(A a, NOT N n, NOT M m, B b) WITHIN 100"
    assert ids(q, [ev(1, "A", 10), ev(3, "B", 20)])
    assert not ids(q, [ev(1, "A", 10), ev(2, "M", 15), ev(3, "B", 20)])
    assert not ids(q, [ev(1, "A", 10), ev(2, "N", 15), ev(3, "B", 20)])


def test_not_at_the_start():
    # no N with end(match) - W <= ts < start(X2)
    q = "PATTERN SEQ(NOT N n, A a, B b) WITHIN 100"
    a, b = ev(1, "A", 150), ev(2, "B", 200)
    assert ids(q, [ev(3, "N", 99), a, b]) == {(("a", 1), ("b", 2))}   # before 200 - 100
    assert not ids(q, [ev(3, "N", 100), a, b])                      # exactly end - W
    assert not ids(q, [ev(3, "N", 149), a, b])
    assert ids(q, [ev(3, "N", 150), a, b])                          # not before start(X2)
    assert run(q, [a, b]) == {("q1", (("a", 1), ("b", 2)), 200)}    # detected at max ts


def test_not_at_the_end_waits_for_the_window():
    # no N with end(X_{n-1}) < ts <= start(match) + W; detected at start + W
    q = "PATTERN SEQ(A a, B b, NOT N n) WITHIN 100"
    a, b = ev(1, "A", 50), ev(2, "B", 80)
    assert run(q, [a, b]) == {("q1", (("a", 1), ("b", 2)), 150)}
    assert ids(q, [a, b, ev(3, "N", 80)])       # not after end(X_{n-1})
    assert not ids(q, [a, b, ev(3, "N", 81)])
    assert not ids(q, [a, b, ev(3, "N", 150)])  # start + W is inside
    assert ids(q, [a, b, ev(3, "N", 151)])


def test_not_inside_and():
    # no N with end(match) - W <= ts <= start(match) + W
    q = "PATTERN AND(A a, NOT N n, B b) WITHIN 100"
    a, b = ev(1, "A", 200), ev(2, "B", 250)
    assert run(q, [a, b]) == {("q1", (("a", 1), ("b", 2)), 300)}
    assert ids(q, [a, b, ev(3, "N", 149)])
    assert not ids(q, [a, b, ev(3, "N", 150)])
    assert not ids(q, [a, b, ev(3, "N", 225)])
    assert not ids(q, [a, b, ev(3, "N", 300)])
    assert ids(q, [a, b, ev(3, "N", 301)])


def test_negated_event_is_never_one_of_the_match_events():
    q = "PATTERN AND(A a, NOT A n) WITHIN 100"
    assert ids(q, [ev(1, "A", 10)]) == {(("a", 1),)}
    assert not ids(q, [ev(1, "A", 10), ev(2, "A", 20)])


def test_not_of_a_sub_pattern():
    q = "PATTERN SEQ(A a, NOT (SEQ(N n, M m)), B b) WHERE m.v = n.v WITHIN 100"
    a, b = ev(1, "A", 10), ev(2, "B", 50)
    assert ids(q, [a, b, ev(3, "N", 20, v=1), ev(4, "M", 30, v=2)])        # m.v != n.v
    assert not ids(q, [a, b, ev(3, "N", 20, v=1), ev(4, "M", 30, v=1)])
    assert ids(q, [a, b, ev(3, "M", 20, v=1), ev(4, "N", 30, v=1)])         # wrong order
    assert ids(q, [a, b, ev(3, "N", 5, v=1), ev(4, "M", 30, v=1)])          # N outside gap
    # no window of its own beyond the interval: N and M far apart still block
    q2 = "PATTERN SEQ(A a, NOT (AND(N n, M m)), B b) WITHIN 1000"
    assert not ids(q2, [ev(1, "A", 0), ev(2, "N", 1), ev(3, "M", 999), ev(4, "B", 1000)])


def test_not_in_an_or_branch_that_was_not_taken_imposes_nothing():
    q = "PATTERN SEQ(C c, OR(SEQ(A a, NOT N n, B b), D d)) WITHIN 100"
    es = [ev(1, "C", 1), ev(2, "A", 10), ev(3, "N", 15), ev(4, "B", 20), ev(5, "D", 30)]
    assert ids(q, es) == {(("c", 1), ("d", 5))}


def test_not_conjunct_with_an_unbound_or_variable_is_ignored():
    q = "PATTERN SEQ(OR(A a, B b), NOT N n, C c) WHERE n.v = a.v WITHIN 100"
    es = [ev(1, "B", 10, v=1), ev(2, "N", 15, v=1), ev(3, "C", 20)]
    # b-branch: the conjunct names unbound a, so it is ignored and any N blocks
    assert not ids(q, es)
    es[0] = ev(1, "A", 10, v=2)
    assert ids(q, es)  # a-branch: n.v = a.v is 1 = 2, so N does not block


def test_equivalence_never_constrains_negated_events():
    q = "PATTERN SEQ(A a, NOT N n, B b) WHERE [room] WITHIN 100"
    es = [ev(1, "A", 10, room="r1"), ev(2, "N", 15, room="elsewhere"), ev(3, "B", 20, room="r1")]
    assert not ids(q, es)


def test_nested_seq_negations_use_the_whole_match():
    # leading NOT of a nested SEQ: interval starts at end(match) - W
    q = "PATTERN SEQ(A a, SEQ(NOT N n, B b, C c)) WITHIN 100"
    a, b, c = ev(1, "A", 0), ev(2, "B", 50), ev(3, "C", 90)
    assert not ids(q, [a, b, c, ev(4, "N", 40)])
    assert not ids(q, [a, b, c, ev(4, "N", -10)])   # end(match) - W = -10
    assert ids(q, [a, b, c, ev(4, "N", -11)])
    # trailing NOT of a nested SEQ: up to start(match) + W, detected then
    q2 = "PATTERN AND(D d, SEQ(A a, NOT N n)) WITHIN 100"
    d, a = ev(1, "D", 0), ev(2, "A", 30)
    assert run(q2, [d, a]) == {("q1", (("d", 1), ("a", 2)), 100)}
    assert not ids(q2, [d, a, ev(3, "N", 100)])
    assert ids(q2, [d, a, ev(3, "N", 101)])


def test_detected_at():
    es = [ev(1, "A", 10), ev(2, "B", 30)]
    assert run("PATTERN SEQ(A a, B b) WITHIN 100", es) == {("q1", (("a", 1), ("b", 2)), 30)}
    assert run("PATTERN SEQ(A a, NOT N n, B b) WITHIN 100", es) == {
        ("q1", (("a", 1), ("b", 2)), 30)}
    assert run("PATTERN SEQ(A a, B b, NOT N n) WITHIN 100", es) == {
        ("q1", (("a", 1), ("b", 2)), 110)}
    # a trailing NOT on a branch not taken does not hold the match back
    assert run("PATTERN OR(SEQ(A a, NOT N n), B b) WITHIN 100", es) == {
        ("q1", (("a", 1),), 110), ("q1", (("b", 2),), 30)}


# ----------------------------------------------------------- several queries


def test_several_queries_at_once_named_and_default():
    text = """QUERY pairs PATTERN SEQ(A a, B b) WITHIN 100;
              PATTERN AND(A x, C y) WITHIN 100;
              QUERY none PATTERN SEQ(C c, A a) WITHIN 1"""
    assert run(text, [A1, B1, C1]) == {
        ("pairs", (("a", 1), ("b", 3)), 30), ("q2", (("x", 1), ("y", 5)), 50)}


def test_returns():
    (m,) = ReferenceMatcher(parse(
        "PATTERN SEQ(A a, OR(B b, C c)) WITHIN 100 RETURN a, a.x, c.y, a.ts, a.nope").queries
    ).run([ev(1, "A", 10, x=2.5), ev(2, "B", 20)])
    assert m.returns == (("a", 1), ("a.x", 2.5), ("c.y", None), ("a.ts", 10), ("a.nope", None))


def test_ten_thousand_events_in_seconds():
    import random

    rnd = random.Random(4)
    types = ["Temperature", "Smoke", "Alarm", "Door", "Rain"]
    es = [ev(i, rnd.choice(types), i * 10, room=f"r{rnd.randrange(20)}",
             value=rnd.uniform(0, 100), density=rnd.uniform(0, 10)) for i in range(10_000)]
    text = """
    QUERY fire PATTERN SEQ(Temperature t, NOT Rain r, AND(Smoke s, OR(Alarm a, Door d)))
      WHERE [room] AND t.value > 50 AND s.density > t.value / 10 WITHIN 1 s;
    QUERY pair PATTERN SEQ(Temperature t, Smoke s) WHERE [room] WITHIN 2 s;
    QUERY late PATTERN SEQ(Smoke s, Alarm a, NOT Door d) WHERE [room] WITHIN 500 ms
    """
    started = time.perf_counter()
    ms = ReferenceMatcher(parse(text).queries).run(es)
    elapsed = time.perf_counter() - started
    assert {m.query for m in ms} == {"fire", "pair", "late"}
    print(f"reference: {len(ms)} matches over 10^4 events in {elapsed:.2f} s")


def test_leading_not_conjunct_with_an_or_neighbour():
    # the conjunct names x1; when x1 is bound and the A at ts 0 lacks p, it cannot block
    q = "PATTERN SEQ(NOT A n, OR(A x1, A x2)) WHERE n.p = x1.p WITHIN 1"
    es = [ev(1, "A", 0), ev(2, "A", 1)]
    assert ids(q, es) == {(("x1", 1),), (("x1", 2),), (("x2", 1),)}


# ------------------------------------------------- section 5: Kleene closure


def T(id, ts, value=None, **attrs):
    return ev(id, "T", ts, **({"value": value} if value is not None else {}), **attrs)


def test_kleene_any_match_is_every_list_within_the_window():
    es = [T(1, 1), T(2, 2), T(3, 3), ev(9, "S", 4)]
    got = ids("PATTERN SEQ(T+ t[], S s) WITHIN 10", es)
    lists = {(1,), (2,), (3,), (1, 2), (1, 3), (2, 3), (1, 2, 3)}  # 2^3 - 1
    assert got == {(("t", lst), ("s", 9)) for lst in lists}
    # the window covers every element: with W = 2, lists starting at ts 1 need s by ts 3
    got = ids("PATTERN SEQ(T+ t[], S s) WITHIN 2", es)
    assert got == {(("t", lst), ("s", 9)) for lst in [(2,), (3,), (2, 3)]}


def test_kleene_list_has_strictly_increasing_ts_and_seq_order_is_between_items():
    es = [T(1, 5), T(2, 5), T(3, 6), ev(8, "A", 4), ev(9, "S", 6), ev(10, "S", 7)]
    got = ids("PATTERN SEQ(A a, T+ t[], S s) WITHIN 10", es)
    lists_before_7 = {(1,), (2,), (3,), (1, 3), (2, 3)}  # 1 and 2 share ts 5: never both
    assert got == ({(("a", 8), ("t", lst), ("s", 10)) for lst in lists_before_7}
                   | {(("a", 8), ("t", lst), ("s", 9)) for lst in [(1,), (2,)]})


def test_kleene_element_conditions():
    es = [T(1, 1, 10), T(2, 2, 20), T(3, 3, 15), T(4, 4, 30), ev(9, "S", 5)]
    q = "PATTERN SEQ(T+ t[], S s) WHERE {} WITHIN 10"
    lists = lambda text: {e[0][1] for e in ids(q.format(text), es)}
    # each element, plain and with [i]
    assert lists("t.value > 12") == lists("t[i].value > 12") == {
        (2,), (3,), (4,), (2, 3), (2, 4), (3, 4), (2, 3, 4)}
    # each element from the second on against the one before: true for one element
    assert lists("t[i].value > t[i-1].value") == {
        (1,), (2,), (3,), (4,), (1, 2), (1, 3), (1, 4), (2, 4), (3, 4), (1, 2, 4), (1, 3, 4)}
    # v[1] beside v[i]: every element from the second on against the first
    assert lists("t[i].value >= t[1].value + 10") == {
        (1,), (2,), (3,), (4,), (1, 2), (1, 4), (1, 2, 4), (2, 4), (3, 4)}
    # v[1] and v[last] alone: the first and the last element
    assert lists("t[1].value = 20 AND t[last].value = 30") == {(2, 4), (2, 3, 4)}
    # aggregates over the complete list (binary64; count a number)
    assert lists("count(t) = 3 AND sum(t.value) = 60") == {(1, 2, 4)}
    assert lists("avg(t.value) = 15 AND count(t) >= 2") == {(1, 2), (1, 2, 3)}
    assert lists("min(t.value) = 15 AND max(t.value) = 30") == {(3, 4), (2, 3, 4)}


def test_kleene_aggregate_over_a_missing_or_non_number_attribute_is_false():
    es = [T(1, 1, 10), T(2, 2), T(3, 3, "x"), ev(9, "S", 5)]
    lists = {e[0][1] for e in ids("PATTERN SEQ(T+ t[], S s) WHERE sum(t.value) >= 0 "
                                  "WITHIN 10", es)}
    assert lists == {(1,)}
    # count needs no attribute
    assert len(ids("PATTERN SEQ(T+ t[], S s) WHERE count(t) >= 1 WITHIN 10", es)) == 7


def test_kleene_conditions_with_other_variables_hold_for_every_element_and_pair():
    es = [ev(1, "A", 1, x=5), ev(2, "A", 2, x=1), ev(3, "B", 3, x=4), ev(4, "B", 4, x=9)]
    got = ids("PATTERN SEQ(A+ a[], B+ b[]) WHERE a.x < b.x WITHIN 10", es)
    # every (a element, b element) pair: a list holding 5 needs b elements above 5
    assert got == {(("a", (1,)), ("b", (4,))), (("a", (2,)), ("b", (3,))),
                   (("a", (2,)), ("b", (4,))), (("a", (2,)), ("b", (3, 4))),
                   (("a", (1, 2)), ("b", (4,)))}


def test_kleene_equivalence_covers_every_element():
    es = [T(1, 1, room="r1"), T(2, 2, room="r2"), T(3, 3, room="r1"),
          ev(9, "S", 4, room="r1")]
    lists = {e[0][1] for e in ids("PATTERN SEQ(T+ t[], S s) WHERE [room] WITHIN 10", es)}
    assert lists == {(1,), (3,), (1, 3)}


def test_negation_conjunct_over_a_kleene_variable_blocks_when_it_holds_for_every_element():
    es = [T(1, 1, room="r1"), T(2, 2, room="r2"), ev(5, "R", 3, room="r1"), ev(9, "S", 4)]
    lists = {e[0][1] for e in ids("PATTERN SEQ(T+ t[], NOT R r, S s) WHERE r.room = t.room "
                                  "WITHIN 10", es)}
    # R (room r1) blocks (1,) and nothing holding t2 (r2): the conjunct fails for t2
    assert lists == {(2,), (1, 2)}
    # the negation interval starts at the end of the list
    es = [T(1, 1, room="r1"), ev(5, "R", 2, room="r1"), T(2, 3, room="r1"), ev(9, "S", 4)]
    lists = {e[0][1] for e in ids("PATTERN SEQ(T+ t[], NOT R r, S s) WHERE r.room = t.room "
                                  "WITHIN 10", es)}
    assert lists == {(2,), (1, 2)}


def test_kleene_output_and_returns():
    es = [T(1, 1, 10), T(2, 2, 20), ev(9, "S", 3, density=0.5)]
    ms = ReferenceMatcher(parse(
        "QUERY k PATTERN SEQ(T+ t[], S s) WHERE count(t) = 2 WITHIN 10 "
        "RETURN t, count(t), sum(t.value), avg(t.value), min(t.value), max(t.gone), "
        "s.density").queries).run(es)
    (m,) = ms
    assert m.to_json_obj(with_returns=True) == {
        "query": "k", "detected_at": 3, "events": {"t": (1, 2), "s": 9},
        "return": {"t": (1, 2), "count(t)": 2, "sum(t.value)": 30.0, "avg(t.value)": 15.0,
                   "min(t.value)": 10.0, "max(t.gone)": None, "s.density": 0.5}}
    assert isinstance(m.returns[1][1], int)


# ---------------------------------------------- section 5: selection strategies


def strategy_ids(pattern, where, strategy, events, w=10):
    text = f"PATTERN {pattern} {'WHERE ' + where if where else ''} WITHIN {w} USING {strategy}"
    return ids(text, events)


def test_skip_till_next_match_skips_irrelevant_events_only():
    es = [ev(1, "A", 1), ev(2, "X", 2), ev(3, "B", 3), ev(4, "B", 4), ev(5, "A", 5),
          ev(6, "B", 6)]
    assert strategy_ids("SEQ(A a, B b)", "", "skip-till-any-match", es) == {
        (("a", 1), ("b", 3)), (("a", 1), ("b", 4)), (("a", 1), ("b", 6)), (("a", 5), ("b", 6))}
    # the X between a1 and b3 is irrelevant; b3 fits the slot before b4 and b6
    assert strategy_ids("SEQ(A a, B b)", "", "skip-till-next-match", es) == {
        (("a", 1), ("b", 3)), (("a", 5), ("b", 6))}
    # strict: nothing at all between; X stands between a1 and b3
    assert strategy_ids("SEQ(A a, B b)", "", "strict-contiguity", es) == {(("a", 5), ("b", 6))}


def test_skip_till_next_match_fits_use_the_conditions():
    es = [ev(1, "A", 1, x=5), ev(2, "B", 2, x=1), ev(3, "B", 3, x=7), ev(4, "B", 4, x=8)]
    # b2 does not fit (its x is below a's): skipped as irrelevant
    assert strategy_ids("SEQ(A a, B b)", "b.x > a.x", "skip-till-next-match", es) == {
        (("a", 1), ("b", 3))}
    # the window is part of fitting: with W = 1 b2 is the only candidate
    assert strategy_ids("SEQ(A a, B b)", "", "skip-till-next-match", es, w=1) == {
        (("a", 1), ("b", 2))}


def test_skip_till_next_match_kleene_takes_every_fitting_event_and_every_prefix():
    es = [T(1, 1, 10), T(2, 2, 5), T(3, 3, 20), T(4, 4, 30)]
    got = strategy_ids("T t", "", "skip-till-next-match", es)
    assert got == {(("t", 1),), (("t", 2),), (("t", 3),), (("t", 4),)}
    es2 = es + [ev(9, "S", 5)]
    lists = {e[0][1] for e in strategy_ids("SEQ(T+ t[], S s)",
                                            "t[i].value > t[i-1].value",
                                            "skip-till-next-match", es2)}
    # t2 (5) does not fit after t1 (10): skipped; a later start begins a match of its own
    assert lists == {(1, 3, 4), (2, 3, 4), (3, 4), (4,)}
    # a trailing Kleene item: one match per prefix of the list
    es3 = [ev(8, "A", 0)] + es
    lists = {e[1][1] for e in strategy_ids("SEQ(A a, T+ t[])", "t[i].value > t[i-1].value",
                                            "skip-till-next-match", es3)}
    assert lists == {(1,), (1, 3), (1, 3, 4)}


def test_skip_till_next_match_a_later_slot_fitting_ends_the_list():
    # after t1 both the Kleene slot and S are next: the S at ts 2 fits, so the list
    # (1, 3) skipping it does not qualify
    es = [T(1, 1), ev(7, "S", 2), T(3, 3), ev(9, "S", 4)]
    got = strategy_ids("SEQ(T+ t[], S s)", "", "skip-till-next-match", es)
    assert got == {(("t", (1,)), ("s", 7)), (("t", (3,)), ("s", 9))}


def test_skip_till_next_match_with_equivalence_and_negation():
    es = [ev(1, "A", 1, k=1), ev(2, "B", 2, k=2), ev(3, "N", 3, k=1), ev(4, "B", 4, k=1),
          ev(5, "A", 5, k=2), ev(6, "B", 6, k=2)]
    # b2 carries another k: it does not fit after a1
    assert strategy_ids("SEQ(A a, B b)", "[k]", "skip-till-next-match", es) == {
        (("a", 1), ("b", 4)), (("a", 5), ("b", 6))}
    # negations are checked as before: N (k=1) between a1 and b4
    assert strategy_ids("SEQ(A a, NOT N n, B b)", "[k] AND n.k = a.k",
                        "skip-till-next-match", es) == {(("a", 5), ("b", 6))}


def test_partition_contiguity_counts_only_the_matchs_partition():
    es = [ev(1, "A", 1, k=1), ev(2, "X", 2, k=2), ev(3, "B", 3, k=1), ev(4, "X", 4, k=1),
          ev(5, "B", 5, k=1), ev(6, "X", 6)]
    assert strategy_ids("SEQ(A a, B b)", "[k]", "partition-contiguity", es) == {
        (("a", 1), ("b", 3))}
    assert strategy_ids("SEQ(A a, B b)", "[k]", "strict-contiguity", es) == set()
    # with two top-level [attr]s, an event lies between only in both partitions
    es = [ev(1, "A", 1, k=1, j=1), ev(2, "X", 2, k=1, j=2), ev(3, "B", 3, k=1, j=1)]
    assert strategy_ids("SEQ(A a, B b)", "[k] AND [j]", "partition-contiguity", es) == {
        (("a", 1), ("b", 3))}


def test_strict_contiguity_orders_equal_ts_by_id():
    es = [ev(1, "A", 1), ev(3, "X", 2), ev(4, "B", 2), ev(2, "B", 2)]
    # stream order: a1, b2, x3, b4 (ts, then id)
    assert strategy_ids("SEQ(A a, B b)", "", "strict-contiguity", es) == {(("a", 1), ("b", 2))}


def test_every_strategy_is_a_subset_of_any_match():
    es = [T(i, i, v, room=f"r{i % 2}") for i, v in enumerate([3, 1, 4, 1, 5, 9, 2, 6], 1)]
    es += [ev(20, "S", 5, room="r1"), ev(21, "S", 9, room="r0")]
    pattern, where = "SEQ(T+ t[], S s)", "[room] AND t[i].value >= t[i-1].value"
    every = strategy_ids(pattern, where, "skip-till-any-match", es)
    for strategy in ("skip-till-next-match", "strict-contiguity", "partition-contiguity"):
        got = strategy_ids(pattern, where, strategy, es)
        assert got and got <= every, strategy


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kleene_queries(), kleene_event_streams())
def test_every_strategy_filters_the_any_match_result(q, events):
    """A strategy keeps a subset of the skip-till-any-match matches of the same query,
    and what it keeps is what its definition keeps (checked on the lists here)."""
    chosen = ReferenceMatcher([q]).run(events)
    every = ReferenceMatcher([dataclasses.replace(q, strategy="skip-till-any-match")]).run(
        events)
    assert {m.key for m in chosen} <= {m.key for m in every}
    for m in chosen:
        for var, value in m.events:
            if isinstance(value, tuple):  # a Kleene list: ids in strictly increasing ts
                ts = [next(e.ts for e in events if e.id == i) for i in value]
                assert value and ts == sorted(set(ts))


# ------------------------------------------------- after-match policies (spec section 6)

def policy(text, events, name):
    """The matches with and without ``AFTER MATCH name`` (as sets of events tuples)."""
    return ids(f"{text} AFTER MATCH {name}", events), ids(text, events)


def test_skip_past_last_event_gives_one_match_per_incident():
    # every (A, B) pair of A1 A2 B3 B4: under the policy, walked in detection order
    # (last, then first): (A1,B3) is accepted; (A2,B3) and both with B4 start before B3
    got, every = policy("PATTERN SEQ(A a, B b) WITHIN 100", [A1, A2, B1, B2],
                        "SKIP PAST LAST EVENT")
    assert len(every) == 4 and got == {(("a", 1), ("b", 3))}
    # a second incident after the first one's last event is accepted
    later = [ev(6, "A", 60), ev(7, "B", 70)]
    got, _ = policy("PATTERN SEQ(A a, B b) WITHIN 100", [A1, A2, B1, B2] + later,
                    "SKIP PAST LAST EVENT")
    assert got == {(("a", 1), ("b", 3)), (("a", 6), ("b", 7))}


def test_skip_to_next_event_lets_one_match_start_at_each_event():
    # detection order: (A1,B3) (A2,B3) (A1,B4) (A2,B4); first(m) must pass first(m*)
    got, _ = policy("PATTERN SEQ(A a, B b) WITHIN 100", [A1, A2, B1, B2],
                    "SKIP TO NEXT EVENT")
    assert got == {(("a", 1), ("b", 3)), (("a", 2), ("b", 3))}


def test_the_policy_runs_per_partition_of_the_top_level_attrs():
    events = [ev(1, "A", 10, room="r1"), ev(2, "A", 20, room="r2"),
              ev(3, "B", 30, room="r1"), ev(4, "B", 40, room="r2"), ev(5, "B", 50, room="r1")]
    got, every = policy("PATTERN SEQ(A a, B b) WHERE [room] WITHIN 100", events,
                        "SKIP PAST LAST EVENT")
    assert len(every) == 3 and got == {(("a", 1), ("b", 3)), (("a", 2), ("b", 4))}
    # without [room] the three form one partition: (A1,B3) blocks (A2,B4)
    got, _ = policy("PATTERN SEQ(A a, B b) WHERE a.room = b.room WITHIN 100", events,
                    "SKIP PAST LAST EVENT")
    assert got == {(("a", 1), ("b", 3))}


def test_kleene_lists_count_every_element_and_the_rising_run_alerts_once():
    rising = [ev(i, "T", i * 10, room="r", v=i) for i in range(1, 6)] + [ev(9, "S", 90, room="r")]
    text = ("PATTERN SEQ(T+ t[], S s) WHERE [room] AND t[i].v > t[i-1].v AND count(t) >= 3 "
            "WITHIN 1000 USING skip-till-next-match")
    got, every = policy(text, rising, "SKIP PAST LAST EVENT")
    assert len(every) == 3 and got == {(("t", (1, 2, 3, 4, 5)), ("s", 9))}
    got, _ = policy(text, rising, "SKIP TO NEXT EVENT")  # one per start: all three
    assert len(got) == 3


def test_detection_order_breaks_ties_by_first_event_then_the_whole_list():
    # AND(A a, B b): (A1,B3) and (B3... all end at B4 or later; same last -> earlier first
    events = [ev(1, "A", 10), ev(2, "B", 20), ev(3, "A", 30), ev(4, "C", 40)]
    got, every = policy("PATTERN SEQ(AND(A a, B b), C c) WITHIN 100", events,
                        "SKIP TO NEXT EVENT")
    # (A1,B2,C4) and (A3,B2,C4) end at C4; first: A1 (10) < B2 (20): (A1,B2,C4) first;
    # then (A3,B2,C4) starts at B2, after A1: accepted too
    assert len(every) == 2 and got == every
    got, _ = policy("PATTERN SEQ(AND(A a, B b), C c) WITHIN 100", events,
                    "SKIP PAST LAST EVENT")
    assert got == {(("a", 1), ("b", 2), ("c", 4))}


def test_negated_events_do_not_count_and_a_ruled_out_match_blocks_nothing():
    # SEQ(A, NOT X, B): the X between A1 and B3 rules (A1,B3) out; (A2,B3) has no X
    events = [ev(1, "A", 10), ev(5, "X", 15), ev(2, "A", 20), ev(3, "B", 30),
              ev(4, "B", 40)]
    got, every = policy("PATTERN SEQ(A a, NOT X x, B b) WITHIN 100", events,
                        "SKIP PAST LAST EVENT")
    assert every == {(("a", 2), ("b", 3)), (("a", 2), ("b", 4))}
    assert got == {(("a", 2), ("b", 3))}
    # a trailing NOT: (A1,B3) is held and ruled out by X6 within the window; it does
    # not block (A2,B4), whose window has no X
    events = [ev(1, "A", 10), ev(3, "B", 30), ev(6, "X", 35), ev(2, "A", 50), ev(4, "B", 60)]
    got, every = policy("PATTERN SEQ(A a, B b, NOT X x) WITHIN 30", events,
                        "SKIP PAST LAST EVENT")
    assert every == {(("a", 2), ("b", 4))} and got == every


def test_output_lines_of_accepted_matches_are_unchanged():
    text = "QUERY q PATTERN SEQ(A a, B b) WITHIN 100 RETURN a, b"
    with_policy = ReferenceMatcher(parse(text.replace(
        "RETURN", "AFTER MATCH SKIP PAST LAST EVENT RETURN")).queries).run([A1, A2, B1, B2])
    every = ReferenceMatcher(parse(text).queries).run([A1, A2, B1, B2])
    assert [m.to_json_obj(True) for m in with_policy] == [
        m.to_json_obj(True) for m in every if dict(m.events) == {"a": 1, "b": 3}]


def test_the_policy_walks_matches_in_detection_order_whatever_order_they_come_in():
    import random

    from dqcep.baseline.reference import after_match
    events = [ev(1, "A", 10), ev(2, "B", 20), ev(3, "A", 30), ev(4, "B", 40), ev(5, "B", 50)]
    by_id = {e.id: e for e in events}
    for name, want in (("SKIP PAST LAST EVENT", {(1, 2), (3, 4)}),
                       ("SKIP TO NEXT EVENT", {(1, 2), (3, 4)})):
        q = parse(f"PATTERN SEQ(A a, B b) WITHIN 100 AFTER MATCH {name}").queries[0]
        every = ReferenceMatcher([dataclasses.replace(q, after_match=None)]).run(events)
        rnd = random.Random(4)
        for _ in range(20):
            rnd.shuffle(every)
            got = {(dict(m.events)["a"], dict(m.events)["b"]) for m in after_match(q, every,
                                                                                    by_id)}
            assert got == want, (name, [m.events for m in every])
