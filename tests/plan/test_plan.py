"""Planner: decomposition shapes, cost model, sharing, predicate placement, invariants."""
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqcep.core.events import Event
from dqcep.lang import ast, parse
from dqcep.plan import Kind, Port, build_plan
from dqcep.plan.bytecode import compile_predicate, evaluate_on_events
from dqcep.baseline.expressions import holds
from tests.support.strategies import kleene_queries, queries, query_files
from tests.support.examples import examples
from tests.support.paths import ROOT


def plan_of(text, rates=None):
    p = build_plan(parse(text).queries, rates)
    p.graph.check_invariants()
    return p


def shape(p, v):
    """Nested tuple of the binary tree under v: EVENT -> type name."""
    k = p.kind(v)
    if k == Kind.EVENT:
        return p.types[p.event_type[v]]
    view = p.vertex(v)
    return (k.name, shape(p, view.lchild), shape(p, view.rchild))


def root_shape(p, q=0):
    return shape(p, p.queries[q].root)


def vertices(p, kind):
    return [v for v in range(p.n_vertices) if p.kind(v) == kind]


# ---------------------------------------------------------------- decomposition


def test_nary_operators_become_binary_left_deep_by_default():
    p = plan_of("PATTERN SEQ(A a, B b, C c, D d) WITHIN 1 s")
    assert root_shape(p) == ("SEQ", ("SEQ", ("SEQ", "A", "B"), "C"), "D")
    p = plan_of("PATTERN OR(A a, B b, C c) WITHIN 1 s")
    assert root_shape(p) == ("OR", ("OR", "A", "B"), "C")
    p = plan_of("PATTERN AND(A a, B b, C c) WITHIN 1 s")
    assert root_shape(p) == ("AND", ("AND", "A", "B"), "C")


def test_every_operator_vertex_has_one_operator_and_two_operands():
    p = plan_of("PATTERN SEQ(A a, AND(B b, C c, D d), OR(E e, F f, G g), H h) WITHIN 1 s")
    for v in range(p.n_vertices):
        ports = sorted(int(p.graph.port[a]) for a in p.graph.in_arcs(v))
        if p.kind(v) in (Kind.SEQ, Kind.AND, Kind.OR):
            assert ports == [Port.LEFT, Port.RIGHT]
        elif p.kind(v) == Kind.EVENT:
            assert ports == []
    assert root_shape(p) == ("SEQ", ("SEQ", ("SEQ", "A", ("AND", ("AND", "B", "C"), "D")),
                                     ("OR", ("OR", "E", "F"), "G")), "H")


def test_cost_model_chooses_the_bracketing_with_fewer_partial_matches():
    text = "PATTERN SEQ(A a, B b, C c) WITHIN 1 s"
    # A is frequent, B and C rare: join B with C first
    p = plan_of(text, {"A": 1000, "B": 1, "C": 1})
    assert root_shape(p) == ("SEQ", "A", ("SEQ", "B", "C"))
    # C frequent: the default left-deep tree is best
    assert root_shape(plan_of(text, {"A": 1, "B": 1, "C": 1000})) == (
        "SEQ", ("SEQ", "A", "B"), "C")
    # a selective predicate between b and c makes (B C) cheap too
    p = plan_of("PATTERN SEQ(A a, B b, C c) WHERE b.k = c.k AND c.x = b.x WITHIN 1 s")
    assert root_shape(p) == ("SEQ", "A", ("SEQ", "B", "C"))


def test_cost_model_reorders_and_operands():
    p = plan_of("PATTERN AND(A a, B b, C c) WITHIN 1 s", {"A": 1000, "B": 2, "C": 3})
    assert root_shape(p) == ("AND", ("AND", "B", "C"), "A")
    assert p.queries[0].slot_of == (("b", 0), ("c", 1), ("a", 2))
    assert p.queries[0].variables == ("a", "b", "c")


def test_estimates_and_total_cost():
    p = plan_of("PATTERN SEQ(A a, B b) WHERE a.x = 1 WITHIN 10 s", {"A": 2, "B": 3})
    leaf_a = [v for v in vertices(p, Kind.EVENT) if p.types[p.event_type[v]] == "A"][0]
    assert p.estimate[leaf_a] == 2 * 10 * 0.1
    root = p.queries[0].root
    assert p.estimate[root] == 2.0 * 30 / 2
    assert p.total_cost == p.estimate[root]


# ----------------------------------------------------------------------- NOT


def test_not_is_a_unary_guard_on_the_gap_it_constrains():
    p = plan_of("PATTERN SEQ(A a, B b, NOT N n, C c) WITHIN 1 s")
    (nv,) = vertices(p, Kind.NOT)
    g = p.guard[nv]
    assert g.mode == "GAP" and not g.holds_back
    host = p.vertex(nv).parents[0]
    assert shape(p, host) == ("SEQ", ("SEQ", "A", "B"), "C")
    assert [p.slots[host][s] for s in g.left_slots] == ["b"]
    assert [p.slots[host][s] for s in g.right_slots] == ["c"]
    arcs = [a for a in p.graph.in_arcs(host) if p.graph.port[a] == Port.GUARD]
    assert [int(p.graph.tail[a]) for a in arcs] == [nv]
    assert p.types[p.event_type[p.vertex(nv).lchild]] == "N"
    # with B C joined first, the gap b|c is decided at the inner vertex
    p = plan_of("PATTERN SEQ(A a, B b, NOT N n, C c) WITHIN 1 s", {"A": 1000})
    (nv,) = vertices(p, Kind.NOT)
    assert shape(p, p.vertex(nv).parents[0]) == ("SEQ", "B", "C")


def test_whole_match_negations_are_checked_at_the_output():
    p = plan_of("PATTERN SEQ(NOT L l, A a, B b, NOT T t) WITHIN 1 s;"
                "PATTERN AND(A a, NOT N n, B b) WITHIN 2 s")
    modes = {}
    for nv in vertices(p, Kind.NOT):
        (host,) = p.vertex(nv).parents
        assert p.kind(host) == Kind.OUTPUT
        modes[p.guard[nv].mode] = (p.guard[nv].holds_back, p.guard[nv].window_ms)
    assert modes == {"LEADING": (False, 1000), "TRAILING": (True, 1000), "AND": (True, 2000)}


def test_negated_sub_pattern_is_its_own_unbounded_subtree():
    p = plan_of("PATTERN SEQ(A a, NOT (SEQ(N n, M m)), B b) WHERE m.v = n.v AND n.v > a.v "
                "WITHIN 1 s")
    (nv,) = vertices(p, Kind.NOT)
    child = p.vertex(nv).lchild
    assert shape(p, child) == ("SEQ", "N", "M")
    assert p.window[child] == -1
    assert [x.text for x in p.preds[child]] == ["m.v = n.v"]
    assert [x.text for x in p.guard[nv].preds] == ["n.v > a.v"]
    # guard predicates address host slots first, then the negated pattern's
    assert p.guard[nv].preds[0].slots == (0, 2)


def test_negation_conjunct_lifts_the_guard_to_where_its_variables_are_bound():
    p = plan_of("PATTERN AND(X x, SEQ(A a, NOT N n, B b)) WHERE n.v = x.v WITHIN 1 s")
    (nv,) = vertices(p, Kind.NOT)
    host = p.vertex(nv).parents[0]
    assert shape(p, host) == ("AND", "X", ("SEQ", "A", "B"))
    g = p.guard[nv]
    assert [p.slots[host][s] for s in g.active_slots] == ["a", "b"]


def test_negated_single_variable_conjunct_is_a_filter_of_the_negated_leaf():
    p = plan_of("PATTERN SEQ(A a, NOT W w, B b) WHERE w.open = true WITHIN 1 s")
    (nv,) = vertices(p, Kind.NOT)
    leaf = p.vertex(nv).lchild
    assert [x.text for x in p.preds[leaf]] == ["w.open = true"]
    assert p.guard[nv].preds == ()
    assert [f.preds[0].text for f in p.pushdown_filters()["W"]] == ["w.open = true"]


# ------------------------------------------------------------------- placement


def test_predicate_placement():
    p = plan_of("""PATTERN SEQ(A a, B b, C c)
                   WHERE a.x > 5 AND b.y = 'on' AND a.x < b.x AND c.z = a.z + b.z
                     AND ([room] OR c.z > 1) AND 1 < 2
                   WITHIN 1 s""")
    by_text = {}
    for v in range(p.n_vertices):
        for pred in p.preds[v]:
            by_text[pred.text] = shape(p, v) if p.kind(v) != Kind.OUTPUT else "OUTPUT"
    assert by_text == {
        "a.x > 5": "A", "b.y = 'on'": "B",
        "a.x < b.x": ("SEQ", "A", "B"),
        "c.z = a.z + b.z": ("SEQ", ("SEQ", "A", "B"), "C"),
        "[room] OR c.z > 1": "OUTPUT",
    }
    assert p.queries[0].preds[0].text == "[room] OR c.z > 1"
    assert not p.queries[0].never


def test_equivalence_becomes_the_partition_key_of_every_vertex():
    p = plan_of("PATTERN SEQ(A a, NOT N n, OR(B b, C c)) WHERE [room] AND [site] WITHIN 1 s")
    for v in range(p.n_vertices):
        k = p.kind(v)
        if k == Kind.NOT or (k == Kind.EVENT and p.types[p.event_type[v]] == "N"):
            assert p.key_attrs[v] == ()  # [attr] never constrains negated events
        elif k != Kind.OUTPUT:
            assert p.key_attrs[v] == ("room", "site")
    assert p.pushdown_filters()["A"][0].required_attrs == ("room", "site")


def test_conjunct_across_or_branches_is_ignored_and_reported():
    p = plan_of("PATTERN OR(A a, B b) WHERE a.x = b.x AND a.y > 1 WITHIN 1 s")
    assert [x.text for v in range(p.n_vertices) for x in p.preds[v]] == ["a.y > 1"]
    assert "a.x = b.x" in p.queries[0].dropped[0]


def test_constant_false_conjunct_means_never():
    assert plan_of("PATTERN A a WHERE 1 > 2 WITHIN 1").queries[0].never
    assert not plan_of("PATTERN A a WHERE 'x' = 'x' WITHIN 1").queries[0].never


def test_pushdown_filters_keep_an_event_if_any_leaf_wants_it():
    p = plan_of("PATTERN SEQ(A a, B b) WHERE a.x > 1 WITHIN 1 s;"
                "PATTERN SEQ(A a, C c) WHERE a.x < 0 WITHIN 1 s;"
                "PATTERN SEQ(B b, C c) WITHIN 1 s")
    f = p.pushdown_filters()
    assert sorted(alt.preds[0].text for alt in f["A"]) == ["a.x < 0", "a.x > 1"]
    assert f["B"][0].preds == () and set(f) == {"A", "B", "C"}


# --------------------------------------------------------------------- sharing

SHARING = """
QUERY q_fire  PATTERN SEQ(Temperature t, Smoke s, Alarm a) WHERE [room] AND t.v > 50 WITHIN 30 s;
QUERY q_door  PATTERN SEQ(Temperature x, Smoke y, Door d)  WHERE [room] AND x.v > 50 WITHIN 1 min;
QUERY q_pair  PATTERN SEQ(Temperature u, Smoke w)          WHERE [room] AND u.v > 50 WITHIN 10 s;
QUERY q_other PATTERN SEQ(Temperature t, Smoke s)          WHERE [room] AND t.v > 60 WITHIN 10 s
"""


def test_identical_sub_queries_become_one_vertex_with_several_parents():
    p = plan_of(SHARING)
    ts = [v for v in vertices(p, Kind.SEQ) if shape(p, v) == ("SEQ", "Temperature", "Smoke")]
    # q_fire, q_door, q_pair share one SEQ(T, S) (variable names differ); q_other's
    # filter differs, so it has its own
    assert len(ts) == 2
    shared = next(v for v in ts if len(p.users[v]) == 3)
    assert set(p.users[shared]) == {"q_fire", "q_door", "q_pair"}
    assert len(p.vertex(shared).parents) == 3  # two SEQ parents and q_pair's OUTPUT
    assert p.window[shared] == 60_000          # the largest window among its users
    assert shared in p.shared_vertices()
    assert p.queries[2].root == shared
    # without sharing the four queries would need 4 + 3 + 3 + 2 + 2 + 2 = 16 vertices
    ops = [v for v in range(p.n_vertices) if p.kind(v) != Kind.OUTPUT]
    assert len(ops) == 9


def test_sharing_spans_nested_sub_patterns_and_negations():
    p = plan_of("PATTERN SEQ(A a, NOT N n, AND(B b, OR(C c, D d))) WITHIN 1 s;"
                "PATTERN SEQ(E e, NOT N m, AND(B x, OR(C y, D z))) WITHIN 1 s")
    ands = [v for v in vertices(p, Kind.AND)]
    assert len(ands) == 1 and len(p.vertex(ands[0]).parents) == 2
    assert len(vertices(p, Kind.OR)) == 1
    assert len(vertices(p, Kind.NOT)) == 1  # the same guard spec on the same gap shape


def test_same_leaf_twice_feeds_both_inputs():
    p = plan_of("PATTERN AND(A x, A y) WITHIN 1 s")
    (leaf,) = vertices(p, Kind.EVENT)
    ports = sorted(int(p.graph.port[a]) for a in p.graph.out_arcs(leaf))
    assert ports == [Port.LEFT, Port.RIGHT]


# ------------------------------------------------------ structure and invariants


def test_vertex_exposes_the_six_domains_and_parents():
    p = plan_of("PATTERN SEQ(A a, B b) WITHIN 1 s")
    root = p.queries[0].root
    view = p.vertex(root)
    assert view.node == root and view.data == "SEQ"
    assert p.label(view.lchild) == "EVENT A" and view.lchild_data == ("a",)
    assert p.label(view.rchild) == "EVENT B" and view.rchild_data == ("b",)
    assert view.parents == (p.queries[0].output,)


def test_plan_is_plain_data_that_pickles_small():
    text = (ROOT / "examples" / "fire.cep").read_text()
    p = build_plan(parse(text).queries)
    blob = pickle.dumps(p)
    assert len(blob) < 8000
    assert b"lark" not in blob and b"dqcep.lang" not in blob
    q = pickle.loads(blob)
    assert (q.graph.tail == p.graph.tail).all() and q.queries == p.queries


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(query_files(max_queries=4))
def test_invariants_on_random_query_files(f):
    p = build_plan(f.queries)
    g = p.graph
    g.check_invariants()  # each arc in exactly one out-list and one in-list; topo order
    assert sorted(map(int, g.topo)) == list(range(p.n_vertices))
    for v in range(p.n_vertices):
        ports = sorted(int(g.port[a]) for a in g.in_arcs(v) if g.port[a] != Port.GUARD)
        expect = {Kind.EVENT: [], Kind.NOT: [Port.CHILD], Kind.OUTPUT: [Port.CHILD]}.get(
            p.kind(v), [Port.LEFT, Port.RIGHT])
        assert ports == expect
        if p.kind(v) != Kind.OUTPUT:
            assert p.vertex(v).parents, f"v{v} feeds nothing"
        view = p.vertex(v)
        if p.kind(v) in (Kind.SEQ, Kind.AND, Kind.OR):
            assert len(p.slots[v]) == len(view.lchild_data) + len(view.rchild_data)
    for q, spec in zip(f.queries, p.queries):
        assert sorted(spec.variables) == sorted(ast.positive_vars(q.pattern))
        assert sorted(v for v, _ in spec.slot_of) == sorted(spec.variables)


# -------------------------------------------------------------------- bytecode

VALUES = st.one_of(st.integers(-3, 3), st.floats(-3, 3, allow_nan=False), st.booleans(),
                   st.sampled_from(["a", "b", ""]))


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queries(types=st.just("T"), var_names=st.sampled_from(["x", "y", "z"]),
               attrs=st.sampled_from(["p", "q"]), max_depth=2), st.data())
def test_bytecode_agrees_with_the_reference_evaluator(q, data):
    vars_ = [e.var for e, neg in ast.event_patterns(q.pattern)]
    events = {}
    for i, var in enumerate(vars_):
        attrs = {a: data.draw(VALUES) for a in ("p", "q") if data.draw(st.booleans())}
        events[var] = Event(i, "T", data.draw(st.integers(0, 5)), attrs)
    slot_of = {v: i for i, v in enumerate(vars_)}
    for c in ast.conjuncts(q.where):
        pred = compile_predicate(c, slot_of, len(vars_))
        assert evaluate_on_events(pred, [events[v] for v in vars_]) == \
            holds(c, events, vars_), pred.text


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kleene_queries(), st.data())
def test_bytecode_over_kleene_lists_agrees_with_the_reference_evaluator(q, data):
    """Lists, v[i-1] / v[1] / v[last] extra slots and aggregates, compiled as the planner
    compiles them, against the reference matcher's reading of spec 5.1."""
    kleene = ast.kleene_vars(q.pattern)
    vars_ = [e.var for e, _ in ast.event_patterns(q.pattern)]
    events, n = {}, iter(range(1000))
    for var in vars_:
        size = data.draw(st.integers(1, 3)) if var in kleene else 1
        made = tuple(Event(next(n), "T", t, {a: data.draw(VALUES) for a in ("p", "q", "room")
                                              if data.draw(st.integers(0, 3))})
                     for t in range(size))
        events[var] = made if var in kleene else made[0]
    slot_of = {v: i for i, v in enumerate(vars_)}
    for c in ast.conjuncts(q.where):
        pred = compile_predicate(c, slot_of, len(vars_), frozenset(kleene), len(vars_))
        got = evaluate_on_events(pred, [events[v] for v in vars_])
        assert got == holds(c, events, vars_), pred.text


def test_guard_conjunct_on_an_or_neighbour_is_kept():
    # Found by hypothesis: the gap's neighbour is an OR, the conjunct names one branch.
    # It applies whenever that branch is taken, so it must not be dropped.
    p = plan_of("PATTERN SEQ(NOT A n, OR(A x1, A x2)) WHERE n.p = x1.p WITHIN 1 s")
    (nv,) = vertices(p, Kind.NOT)
    assert [x.text for x in p.guard[nv].preds] == ["n.p = x1.p"]
    assert p.queries[0].dropped == ()
    # whereas a conjunct with the other branch of an OR around the gap never applies
    p = plan_of("PATTERN OR(SEQ(A a, NOT N n, B b), C c) WHERE n.v = c.v WITHIN 1 s")
    (nv,) = vertices(p, Kind.NOT)
    assert p.guard[nv].preds == ()
    assert "never bound together" in p.queries[0].dropped[0]


def test_gap_guard_rises_to_where_a_same_type_variable_is_bound():
    # a0 (type A) may bind the event in the gap of NOT A b: decide the NOT where a0 is bound
    p = plan_of("PATTERN AND(SEQ(A a, NOT A b, C c), A a0) WITHIN 2 s")
    (nv,) = vertices(p, Kind.NOT)
    (host,) = p.vertex(nv).parents
    assert shape(p, host) == ("AND", ("SEQ", "A", "C"), "A")
    # no variable of type N elsewhere: the guard stays on its gap
    p = plan_of("PATTERN AND(SEQ(A a, NOT N b, C c), A a0) WITHIN 2 s")
    (nv,) = vertices(p, Kind.NOT)
    assert shape(p, p.vertex(nv).parents[0]) == ("SEQ", "A", "C")


# ------------------------------------------------- section 5: Kleene closure


def test_kleene_item_is_a_unary_iteration_vertex_over_its_event_vertex():
    p = plan_of("QUERY k PATTERN SEQ(A a, T+ t[], B b) WITHIN 10")
    (kv,) = vertices(p, Kind.KLEENE)
    child = p.vertex(kv).lchild
    assert p.kind(child) == Kind.EVENT and p.types[p.event_type[child]] == "T"
    assert [int(p.graph.port[a]) for a in p.graph.in_arcs(kv)] == [Port.CHILD]
    assert p.label(kv) == "KLEENE T+" and p.lists[kv] == (0,)
    root = p.queries[0].root
    assert p.slots[root] == ("a", "t", "b") and p.lists[root] == (1,)
    spec = p.queries[0]
    assert spec.strategy == "skip-till-any-match" and spec.lists == ("t",)


def test_a_query_under_a_strategy_is_one_run_vertex():
    """Spec 5.2: a strategy reads the events after a match's prefix in stream order, so
    the flat SEQ is one RUN vertex (no joins), every positive condition on its record,
    [attr] as its key, negations at the OUTPUT; equal RUN vertices are shared."""
    p = plan_of("QUERY k PATTERN SEQ(A a, T+ t[], NOT N n, B b) WHERE [room] AND a.v > 1 "
                "AND t[i].v > t[i-1].v AND b.v > t.v AND count(t) >= 2 WITHIN 10 "
                "USING skip-till-next-match;"
                "QUERY j PATTERN SEQ(A x, T+ y[], NOT N m, B z) WHERE [room] AND x.v > 1 "
                "AND y[i].v > y[i-1].v AND z.v > y.v AND count(y) >= 2 WITHIN 20 "
                "USING skip-till-next-match;"
                "QUERY s PATTERN SEQ(A a, B b) WITHIN 10 USING strict-contiguity")
    runs = vertices(p, Kind.RUN)
    assert len(runs) == 2 and not vertices(p, Kind.KLEENE) and not vertices(p, Kind.SEQ)
    k, j, s = p.queries
    assert k.root == j.root and sorted(p.users[k.root]) == ["j", "k"]
    assert int(p.window[k.root]) == 20
    assert p.label(k.root) == "RUN SEQ(A, T+, B) USING skip-till-next-match"
    assert p.run[k.root].kleene == (False, True, False) and not p.run[k.root].contiguity
    assert p.slots[k.root] == ("a", "t", "b") and p.lists[k.root] == (1,)
    assert p.key_attrs[k.root] == ("room",) and k.preds == ()
    assert {x.text for x in p.preds[k.root]} == {"a.v > 1", "t[i].v > t[i-1].v", "b.v > t.v",
                                                 "count(t) >= 2"}
    nots = vertices(p, Kind.NOT)  # one per query: their windows differ
    assert sorted(v for nv in nots for v in p.vertex(nv).parents) == sorted([k.output, j.output])
    assert p.run[s.root].contiguity and p.label(s.root) == "RUN SEQ(A, B) USING strict-contiguity"


def test_kleene_conditions_are_placed_by_what_they_read():
    p = plan_of("PATTERN SEQ(T+ t[], S s) WHERE t.value > 20 AND t[i].value > t[i-1].value "
                "AND t[1].value > 3 AND count(t) >= 3 AND t[last].x = 1 "
                "AND t.value < s.d AND max(t.value) < s.d WITHIN 10")
    (kv,) = vertices(p, Kind.KLEENE)
    leaf = p.vertex(kv).lchild
    # each element by itself: a filter of the events (pushed down as any filter)
    assert [x.text for x in p.preds[leaf]] == ["t.value > 20"]
    assert p.pushdown_filters()["T"][0].preds[0].text == "t.value > 20"
    # an element against the one before or the first, and the whole list: at KLEENE
    at_kleene = {x.text: x for x in p.preds[kv]}
    assert set(at_kleene) == {"t[i].value > t[i-1].value", "t[1].value > 3", "count(t) >= 3",
                              "t[last].x = 1"}
    rising = at_kleene["t[i].value > t[i-1].value"]
    assert rising.lists == ((0, 1),) and rising.extras == ((0, 0),) and not rising.whole_list
    assert at_kleene["count(t) >= 3"].whole_list and at_kleene["t[last].x = 1"].whole_list
    assert at_kleene["t[1].value > 3"].lists == () and not at_kleene["t[1].value > 3"].whole_list
    # with another variable: where both are bound, for every element
    (seq,) = vertices(p, Kind.SEQ)
    joined = {x.text: x for x in p.preds[seq]}
    assert joined["t.value < s.d"].lists == ((0, 0),)
    assert joined["max(t.value) < s.d"].whole_list and joined["max(t.value) < s.d"].lists == ()


def test_kleene_vertices_are_shared_like_any_other():
    p = plan_of("QUERY a PATTERN SEQ(T+ t[], S s) WHERE [room] AND t[i].v > t[i-1].v WITHIN 10;"
                "QUERY b PATTERN SEQ(T+ u[], S x) WHERE [room] AND u[i].v > u[i-1].v WITHIN 20;"
                "QUERY c PATTERN SEQ(T+ w[], S y) WHERE [room] AND w[i].v < w[i-1].v WITHIN 10;"
                "QUERY d PATTERN SEQ(T t, S s) WHERE [room] WITHIN 10")
    kleene = vertices(p, Kind.KLEENE)
    assert len(kleene) == 2  # a and b share theirs; c's condition differs
    shared = [v for v in kleene if len(p.users[v]) > 1]
    assert [sorted(p.users[v]) for v in shared] == [["a", "b"]]
    assert int(p.window[shared[0]]) == 20  # a shared vertex prunes with its largest window
    # the plain SEQ(T, S) of d shares the leaves, not the SEQ over a list
    seqs = vertices(p, Kind.SEQ)
    assert len(seqs) == 3


def test_explain_shows_kleene_vertices_their_conditions_and_the_strategy():
    from dqcep.plan.explain import explain_dot, explain_text
    query = ("PATTERN SEQ(T+ t[], NOT R r, S s) WHERE [room] AND t.v > 1 "
             "AND t[i].v > t[i-1].v AND t[1].v > 0 AND count(t) >= 2 AND r.v = t.v "
             "WITHIN 1 s")
    p = plan_of(f"QUERY k {query}; QUERY n {query} USING skip-till-next-match")
    text = explain_text(p)
    for line in ("KLEENE T+", "slots [t[]]", "slots [t[], s]",
                 "each element after the first: t[i].v > t[i-1].v",
                 "the first element: t[1].v > 0", "each list: count(t) >= 2",
                 "filter: t.v > 1", "satisfying r.v = t.v",
                 "k: OUTPUT v", "USING skip-till-next-match, lists: t",
                 # under a strategy: one RUN vertex, each condition where it is checked
                 "RUN SEQ(T+, S) USING skip-till-next-match",
                 "as each t[] element comes: t[i].v > t[i-1].v",
                 "as each t[] element comes: t.v > 1", "on each match (whole lists): count(t) >= 2"):
        assert line in text, line
    dot = explain_dot(p)
    assert "shape=hexagon" in dot and "USING skip-till-next-match" in dot
    assert "shape=octagon" in dot
    strict = explain_text(plan_of("PATTERN SEQ(A a, B b) WITHIN 5 USING strict-contiguity"))
    assert "every event, of any type" in strict


def test_native_engine_runs_all_of_section5():
    """Every form of spec section 5 compiles for the native engine (the differential
    tests in test_native.py hold it to the reference)."""
    from dqcep.runtime import Engine
    for text in ("PATTERN SEQ(A a, T+ t[]) WHERE t[i].x > t[i-1].x AND count(t) > 2 "
                 "AND a.x > 1 WITHIN 5",
                 "PATTERN SEQ(A a, T+ t[]) WHERE t.x > a.x WITHIN 5",  # a list with others
                 "PATTERN SEQ(T+ t[], B b) WHERE [room] OR b.x = 1 WITHIN 5",  # [room] nested
                 "PATTERN AND(SEQ(T+ t[], B b), T c) WHERE max(t.x) < c.x WITHIN 5",
                 "PATTERN SEQ(T+ t[], NOT N n, B b) WHERE n.x = t.x WITHIN 5",  # NOT beside
                 "PATTERN SEQ(A a, T+ t[], NOT N n, B b) WITHIN 5 USING skip-till-next-match",
                 "PATTERN SEQ(A a, B b) WHERE [room] OR a.x = 1 WITHIN 5 USING strict-contiguity",
                 "PATTERN SEQ(A a, NOT N n, B b) WITHIN 5 USING skip-till-next-match"):
        Engine(plan_of(text))
    for strategy in ("skip-till-next-match", "strict-contiguity", "partition-contiguity"):
        # under a strategy (a RUN vertex) conditions may also read a list with others
        Engine(plan_of("PATTERN SEQ(A a, T+ t[], B b) WHERE [room] AND t.x > a.x "
                       f"AND b.x > max(t.x) WITHIN 5 USING {strategy}"))


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kleene_queries())
def test_invariants_on_random_kleene_queries(q):
    p = build_plan([q])
    p.graph.check_invariants()
    for v in vertices(p, Kind.KLEENE):
        assert p.kind(p.vertex(v).lchild) == Kind.EVENT and p.lists[v] == (0,)
        for pred in p.preds[v]:  # only the list's own variable, never a filter alone
            assert pred.slots == (0,) and (pred.lists or pred.extras or pred.whole_list)
    spec = p.queries[0]
    root = spec.root
    assert {p.slots[root][i] for i in p.lists[root]} == set(spec.lists) == ast.kleene_vars(
        q.pattern)


def test_materialization_follows_the_cost_and_the_dag():
    """plan/joins.py: a SEQ vertex whose parent's right input comes rarely is built on
    demand by its parent (auto: it costs less time built again for each such record
    than built once and kept); one whose parent's right input comes often, one shared
    by two parents, or with a NOT checked on it, keeps its records; 'always' and
    'on-demand' force the choice; explain says which."""
    from dqcep.plan import explain_text
    # (inside an AND: a flat SEQ alone may run as a chain under auto)
    chain = parse("QUERY c PATTERN AND(SEQ(A a, B b, C c), D d) WHERE [k] "
                  "WITHIN 1 min").queries
    rates = {"A": 10.0, "B": 10.0, "C": 10.0}
    rare = build_plan(chain, dict(rates, A=0.001, C=0.001), materialize="auto")
    ab = next(v for v in range(rare.n_vertices) if rare.slots[v] == ("a", "b"))
    assert rare.on_demand[ab] and rare.materialization[ab].startswith("on demand (est.")
    assert "records: on demand" in explain_text(rare)
    plan = build_plan(chain, rates, materialize="auto")
    assert not any(plan.on_demand)
    assert not any(build_plan(chain, rates).on_demand)  # the default: always
    assert build_plan(chain, {"A": 0.01}, materialize="on-demand").on_demand[ab]
    shared = parse("QUERY x PATTERN SEQ(A a, B b, C c) WHERE [k] WITHIN 1 min;"
                   "QUERY y PATTERN SEQ(A a, B b, D d) WHERE [k] WITHIN 1 min").queries
    plan = build_plan(shared, dict(rates, D=10.0), materialize="on-demand")
    ab = next(v for v in range(plan.n_vertices) if plan.slots[v] == ("a", "b"))
    assert not plan.on_demand[ab] and "shared by several parents" in plan.materialization[ab]
    guarded = parse("PATTERN SEQ(A a, NOT N n, B b, C c) WITHIN 1 min").queries
    plan = build_plan(guarded, rates, materialize="on-demand")
    ab = next(v for v in range(plan.n_vertices) if plan.slots[v] == ("a", "b"))
    assert not plan.on_demand[ab] and "a NOT is checked" in plan.materialization[ab]
    with pytest.raises(ValueError, match="materialize must be one of"):
        build_plan(chain, materialize="sometimes")


def test_auto_runs_a_query_as_a_chain_where_its_estimated_work_is_smaller():
    """Issue 40: under auto the cost model estimates a flat skip-till-any-match SEQ's
    work as joins and as one chain and takes the smaller; a Kleene list tied to a
    neighbour (exponential as joins) runs as a chain, a rising run whose lists the
    joins make once for every neighbour as joins; a query whose joins another query
    shares stays joins; explain shows the choice and both estimates."""
    from dqcep.plan import explain_text
    rates = {"A": 100.0, "B": 100.0, "C": 100.0}

    def choice(text, rates=rates, materialize="auto"):
        plan = build_plan(parse(text).queries, rates, materialize=materialize)
        return plan, [q.construction for q in plan.queries]

    tied = "QUERY t PATTERN SEQ(A a, B+ b[], C c) WHERE b.x > a.x AND c.x < a.x WITHIN 100 ms"
    plan, kinds = choice(tied)
    assert kinds == ["chain"] and [plan.kind(v) for v in range(plan.n_vertices)] == \
        [Kind.RUN, Kind.OUTPUT]
    assert "runs as: chain (est. work per window: chain" in explain_text(plan)
    rising = "QUERY r PATTERN SEQ(A a, B+ b[], C c) WHERE b[i].x > b[i-1].x WITHIN 100 ms"
    assert choice(rising)[1] == ["joins"]
    assert choice(rising, materialize="chain")[1] == ["chain"]
    assert choice(tied, materialize="always")[1] == ["joins"]
    assert choice("QUERY s PATTERN SEQ(A a, B b, C c) WITHIN 100 ms")[1] == ["chain"]
    # an equality index makes the joins cheaper than trying every pair
    assert choice("QUERY e PATTERN SEQ(A a, B b, C c) WHERE a.x = b.x WITHIN 1 s")[1] == \
        ["joins"]
    shared = ("QUERY x PATTERN SEQ(A a, B b, C c) WITHIN 100 ms;"
              "QUERY y PATTERN SEQ(A a, B b, D d) WITHIN 100 ms")
    plan, kinds = choice(shared, dict(rates, D=100.0))
    assert kinds == ["joins", "joins"] and "shared with y" in plan.queries[0].construction_why
    # not a flat SEQ: no choice to make
    assert choice("QUERY o PATTERN AND(A a, B b) WITHIN 1 s")[1] == ["joins"]
    assert choice("QUERY n PATTERN SEQ(A a, B b) WITHIN 1 s USING skip-till-next-match")[1] \
        == ["runs"]


def test_auto_counts_the_intake_a_chain_does_not_share():
    """A chain takes in every event of its types itself and is handed the whole stream;
    the joins' leaves are taken in once for all the queries that share them. Alone, a
    keyed three-item SEQ runs as a chain; beside 49 others on the same first two leaves
    (bench_engine's W4, where 50 chains ran at 0.47x of the joins) it runs as joins."""
    rates = {f"T{i}": 100.0 for i in range(10)}

    def text(i):
        return (f"QUERY w{i} PATTERN SEQ(T0 a, T1 b, T{2 + i % 8} c) WHERE [key] AND "
                f"c.a0 < {100 + 18 * i} WITHIN 1 s")
    alone = build_plan(parse(text(0)).queries, {"T0": 100.0, "T1": 100.0, "T2": 100.0},
                       materialize="auto")
    assert [q.construction for q in alone.queries] == ["chain"]
    many = build_plan(parse(";\n".join(text(i) for i in range(50))).queries, rates,
                      materialize="auto")
    assert {q.construction for q in many.queries} == {"joins"}
    assert "shared" not in many.queries[0].construction_why  # no operator is shared
