"""Reference matcher: hand-checked cases for every rule of spec sections 3 and 4."""
import time


from dqcep.events import Event
from dqcep.lang import parse
from dqcep.reference import ReferenceMatcher


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
