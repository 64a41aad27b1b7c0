"""Runtime: kernels alone, snapshot/restore, bounded state, engine API behaviour."""

import numpy as np
import pytest

from dqcep._kernels.guards import Guard
from dqcep._kernels.joins import JoinSpec, join_delta
from dqcep._kernels.leaves import LeafRouter, leaf_keys
from dqcep._kernels.predicates import PredicateSet
from dqcep._kernels.ring import KeyedQueue, RingBuffer
from dqcep._kernels.store import EventStore, py_eval
from dqcep.core.errors import UserError
from dqcep.core.events import Event
from dqcep.lang import parse
from dqcep.plan import build_plan
from dqcep.plan.bytecode import compile_predicate
from dqcep.baseline.reference import ReferenceMatcher
from dqcep.runtime import Engine, MatchBatch, run_events
from dqcep.runtime.compile import StringDictionary, predicate_set
from dqcep.runtime.program import Program
from dqcep.generator import GeneratorConfig, UniformConfig, generate
from tests.support.paths import ROOT

NO_PREDS = PredicateSet(np.zeros((0, 3), np.int32), [0], [], [0], [], [])


def store_with(rows, n_attrs=1):
    """rows: (ts, id, [(kind, value)] * n_attrs)"""
    st = EventStore(n_attrs)
    st.append(np.array([r[0] for r in rows], np.int64), np.array([r[1] for r in rows], np.int64),
              np.array([[c[1] for c in r[2]] for r in rows], np.float64).reshape(len(rows), n_attrs),
              np.array([[c[0] for c in r[2]] for r in rows], np.int8).reshape(len(rows), n_attrs))
    return st


# --------------------------------------------------------------------- kernels


def test_keyed_queue_chains_eviction_and_table_sweep():
    q = KeyedQueue(2)
    for i in range(100):
        q.py_append(i, i, i % 3, [i, -1])
    assert q.py_key_positions(1)[:3] == [97, 94, 91]
    assert len(q.py_key_positions(0)) == 34
    assert q.py_evict_end_before(90) == 90
    assert q.py_key_positions(1) == [97, 94, 91]  # chains stop at the head
    assert q.py_record(97) == (97, 97, 1, (97, -1))
    with pytest.raises(IndexError, match="not live"):
        q.py_record(10)
    for i in range(100, 20_000):  # many keys come and go: the table is swept, not grown
        q.py_append(i, i, i, [i, i])
        q.py_evict_end_before(i - 50)
    assert len(q) == 51 and q.nbytes < 64 * 1024
    assert q.py_key_positions(19_990) == [19_990] and q.py_key_positions(5) == []


def test_event_store_wraps_and_grows():
    st = EventStore(1)
    for base in range(0, 5000, 100):
        rows = [(t, t + 1000, [(1, t * 0.5)]) for t in range(base, base + 100)]
        st.append(np.array([r[0] for r in rows]), np.array([r[1] for r in rows]),
                          np.array([[r[2][0][1]] for r in rows]), np.ones((100, 1), np.int8))
        st.evict_before(base - 300)
    assert len(st) == 400 and st.base == 4600
    assert st.cell(4999, 0) == (1, 2499.5)
    assert st.ids_of(np.array([[4999, -1]])).tolist() == [[5999, -1]]
    with pytest.raises(IndexError, match="not in the store"):
        st.cell(10, 0)


def test_kernels_refuse_bytecode_they_cannot_run_safely():
    """The unchecked nogil evaluator only ever sees code the kernel checked on entry."""
    from dqcep._kernels.predicates import BytecodeError
    from dqcep.plan.bytecode import Op

    def pset(code, consts=(1.0,), slots=(0,)):
        return PredicateSet(np.array(code, np.int32).reshape(-1, 3), [0, len(code)],
                            list(slots), [0, len(slots)], np.array(consts, np.float64),
                            np.ones(len(consts), np.int8))

    ok = pset([(Op.LOAD, 0, 0), (Op.CONST, 0, 0), (Op.LT, 0, 0)])
    assert (ok.max_slot, ok.max_attr) == (0, 0)
    for code, what in [([(99, 0, 0)], "unknown opcode 99"),
                       ([(Op.CONST, 1, 0)], "CONST 1 outside the 1 constants"),
                       ([(Op.CONST, 0, 0), (Op.LT, 0, 0)], "needs two operands"),
                       ([(Op.NOT, 0, 0)], "pops an empty stack"),
                       ([(Op.CONST, 0, 0), (Op.CONST, 0, 0)], "leaves 2 values"),
                       ([(Op.LOAD, -1, 0)], "reads slot -1"),
                       ([(Op.LOAD, 0, -3)], "column -3"),
                       ([(Op.CONST, 0, 0)] * 129 + [(Op.ADD, 0, 0)] * 128,
                        "more than 128 operands")]:
        with pytest.raises(BytecodeError, match=what) as err:
            pset(code)
        assert err.value.predicate == 0
    with pytest.raises(ValueError, match="pred_start must run from 0 to 3"):
        PredicateSet(np.zeros((3, 3), np.int32), [0, 2], [], [0, 0], [], [])
    with pytest.raises(ValueError, match="constant 0 has kind 9"):
        PredicateSet(np.zeros((0, 3), np.int32), [0], [], [0], [1.0], [9])
    # Inputs are checked against what the code reads, where they come in.
    st = store_with([(5, 1, [(1, 2.0)])])
    wide = pset([(Op.LOAD, 2, 0), (Op.CONST, 0, 0), (Op.LT, 0, 0)])
    with pytest.raises(ValueError, match="read slot 2, records have 1"):
        wide.mask(st, np.zeros((1, 1), np.int64))
    with pytest.raises(ValueError, match="read column 3, the store has 1"):
        pset([(Op.LOAD, 0, 3), (Op.CONST, 0, 0), (Op.LT, 0, 0)]).mask(
            st, np.zeros((1, 1), np.int64))
    with pytest.raises(ValueError, match="a pair has 2"):
        JoinSpec(1, 10, 1, 1, [], wide)
    with pytest.raises(ValueError, match="key column 4"):
        leaf_keys(st, np.zeros(1, np.int64), np.array([4], np.int32))
    # A condition too deep for the stack (the parser stops at 200 levels, so only
    # hand-made bytecode gets here) is a user's error naming the condition.
    from dqcep.plan.bytecode import Predicate
    deep = Predicate(tuple([(Op.CONST, 0, 0)] * 129 + [(Op.ADD, 0, 0)] * 128), (1.0,), (),
                     (), "1 + (1 + ...)")
    with pytest.raises(UserError, match=r"'1 \+ \(1 \+ \.\.\.\)' is nested too deeply"):
        predicate_set([deep], {}, StringDictionary())


def test_bytecode_evaluator_failure_semantics():
    # slot 0 = event with attribute x; kinds: 1 num, 2 str, 3 bool
    st = store_with([(5, 1, [(1, 2.0)]), (6, 2, [(2, 0.0)]), (7, 3, [(0, 0.0)])])
    d = StringDictionary()

    def ev(text, slots):
        q = parse(f"PATTERN AND(A a, B b) WHERE {text} WITHIN 1").queries[0]
        p = compile_predicate(q.where, {"a": 0, "b": 1}, 2)
        ps = predicate_set([p], {"x": 0}, d)
        return py_eval(st, np.asarray(ps.code), np.asarray(ps.cval), np.asarray(ps.ckind),
                       np.array(slots, np.int64))

    assert ev("a.x + 1 = 3", [0, 1])
    assert not ev("a.x = b.x", [0, 1])           # number vs string: fails
    assert not ev("NOT (a.x = b.x)", [0, 1])     # and the failure is not negated
    assert not ev("b.x < 1", [1, 0])             # ordering on a string
    assert not ev("a.x / 0 > 1", [0, 1])         # division by zero
    assert not ev("a.x > 1 OR b.x > 1", [0, 1])  # no short-circuit past a failure
    assert not ev("a.x = 2", [2, 1])             # missing attribute
    assert ev("a.ts = 5 AND a.id = 1", [0, 1])   # ts and id pseudo-attributes
    assert ev("[x] OR true", [0, 0]) and not ev("[x]", [0, 1])


def test_leaf_keys_and_join_processor_alone():
    # events: A at 1,2 (key attr 7, 8), B at 3 (7), B at 4 (8), B at 9 (7)
    st = store_with([(1, 10, [(1, 7)]), (2, 11, [(1, 8)]), (3, 12, [(1, 7)]),
                     (4, 13, [(1, 8)]), (9, 14, [(1, 7)])])
    ok, keys = leaf_keys(st, np.arange(5, dtype=np.int64), np.array([0], np.int32))
    assert ok.all() and keys[0] == keys[2] == keys[4] != keys[1] == keys[3]

    def delta(seqs):
        s = np.array(seqs, np.int64)
        t = st.ts_of(s)
        return t, t.copy(), keys[s], s.reshape(-1, 1)

    spec = JoinSpec(1, 5, 1, 1, np.array([0], np.int32), NO_PREDS)  # SEQ, W = 5, keyed
    left, out = KeyedQueue(1), RingBuffer(2)
    join_delta(spec, st, left, None, *delta([0, 1]), *delta([2, 3, 4]), out)
    s, e, k, ids = out.to_arrays()
    assert sorted(map(tuple, ids.tolist())) == [(0, 2), (1, 3)]  # (0, 4) is outside W
    assert len(left) == 2
    # AND: both orders, equal ts allowed, never the same event twice
    st2 = store_with([(5, 1, [(1, 1)]), (5, 2, [(1, 1)])])
    ok, keys = leaf_keys(st2, np.arange(2, dtype=np.int64), np.zeros(0, np.int32))
    both = (np.array([5, 5]), np.array([5, 5]), np.zeros(2, np.int64),
            np.array([[0], [1]], np.int64))
    out = RingBuffer(2)
    join_delta(JoinSpec(2, 0, 1, 1, [], NO_PREDS), st2, KeyedQueue(1), KeyedQueue(1),
               *both, *both, out)
    assert sorted(map(tuple, out.to_arrays()[3].tolist())) == [(0, 1), (1, 0)]


def test_leaf_router_takes_each_event_to_the_leaves_that_accept_it():
    """One pass: per leaf, the events of its type that carry its key attribute and
    satisfy its filter, in stream order, keyed as leaf_keys keys them."""
    # attribute 0: x; attribute 1: k (missing on the event at ts 3)
    st = store_with([(1, 10, [(1, 5), (1, 7)]), (2, 11, [(1, 1), (1, 7)]),
                     (3, 12, [(1, 9), (0, 0)]), (4, 13, [(1, 6), (1, 8)])], n_attrs=2)
    seqs = np.arange(4, dtype=np.int64)
    types = np.array([0, 0, 0, 1], np.int32)
    d = StringDictionary()
    filt = [compile_predicate(parse("PATTERN A a WHERE a.x > 4 WITHIN 1").queries[0].where,
                              {"a": 0}, 1)]
    # leaf 0: type 0, x > 4; leaf 1: type 0, keyed on k; leaf 2: type 1; leaf 3: type 2
    router = LeafRouter([0, 0, 1, 2], [0, 0, 1, 1, 1], [1],
                        predicate_set(filt, {"x": 0, "k": 1}, d), [0, 1, 1, 1, 1], 3)
    inputs, taken = router.route(st, seqs, st.ts_of(seqs), types)
    assert inputs.tolist() == [3, 3, 1, 0]
    assert [t[2].tolist() for t in taken] == [[0, 2], [0, 1], [3], []]
    assert taken[0][0].tolist() == [1, 3] and taken[0][1].tolist() == [0, 0]
    assert taken[1][1].tolist() == leaf_keys(st, seqs[:2], np.array([1], np.int32))[1].tolist()
    assert taken[1][1][0] == taken[1][1][1]  # the same k, the same key
    with pytest.raises(ValueError, match="types below n_types"):
        LeafRouter([3], [0, 0], [], NO_PREDS, [0, 0], 3)
    with pytest.raises(ValueError, match="ranges must cover"):
        LeafRouter([0], [0, 1], [], NO_PREDS, [0, 0], 1)


def test_guard_processor_alone():
    st = store_with([(10, 1, [(0, 0)]), (15, 2, [(0, 0)]), (20, 3, [(0, 0)]), (30, 4, [(0, 0)])])
    negated = RingBuffer(1)
    negated.push(15, 15, 0, [1])
    gap = Guard(0, 2, [0], [1], [0, 1], NO_PREDS, 100)  # compiled: holds no store
    host = np.array([[0, 2], [2, 3]], np.int64)  # (10, 20) contains 15; (20, 30) does not
    keep = gap.keep(st, negated, np.array([10, 20]), np.array([20, 30]), host)
    assert keep.tolist() == [False, True]
    assert gap.keep(st, RingBuffer(1), np.array([10, 20]), np.array([20, 30]),
                    host).tolist() == [True, True]  # the same guard, another state
    trailing = Guard(2, 1, [0], [], [0], NO_PREDS, 5)  # (end(x), start + 5]
    keep = trailing.keep(st, negated, np.array([10, 10]), np.array([10, 10]),
                         np.array([[0], [-1]], np.int64))
    assert keep.tolist() == [False, True]  # inactive when its slot is unbound
    with pytest.raises(ValueError, match="guard mode 7"):
        Guard(7, 1, [0], [], [0], NO_PREDS, 5)
    with pytest.raises(ValueError, match="host records have 1 slots"):
        gap.keep(st, negated, np.array([10]), np.array([20]), np.array([[0]], np.int64))


# --------------------------------------------------------------- engine API


def uniform_stream(events, seed=1):
    cfg = GeneratorConfig(profile="uniform", events=events, seed=seed,
                          profile_config=UniformConfig(types=3, keys=20, attributes=1,
                                                       domain=10, event_rate=1000))
    return generate(cfg, 1000)


QUERIES = """
QUERY pairs PATTERN SEQ(T0 a, T1 b) WHERE [key] AND a.a0 < b.a0 WITHIN 50 ms;
QUERY guarded PATTERN SEQ(T0 a, NOT T2 n, T1 b) WHERE [key] WITHIN 40 ms;
QUERY trailing PATTERN SEQ(T1 a, T0 b, NOT T2 n) WHERE [key] AND n.key = a.key WITHIN 30 ms;
QUERY either PATTERN AND(T2 c, OR(T0 a, T1 b)) WHERE [key] WITHIN 20 ms;
QUERY chain PATTERN SEQ(T3 a, T1 b, T2 c) WHERE [key] WITHIN 30 ms
"""


def matches_of(mb: MatchBatch):
    return {(m.query, m.events, m.detected_at) for m in mb.to_matches()}


def test_snapshot_mid_stream_resumes_exactly():
    plan = build_plan(parse(QUERIES).queries)
    batches = list(uniform_stream(20_000))
    whole, _ = run_events(plan, batches)
    first = Engine(plan)
    got = MatchBatch(first.match_queries)
    for b in batches[:9]:
        got += first.process(b)
    blob = first.snapshot()
    second = Engine(plan)
    second.restore(blob)
    for b in batches[9:]:
        got += second.process(b)
    got += second.flush()
    assert matches_of(got) == matches_of(whole)
    assert len(whole) > 1000
    assert second.snapshot()[:12] == blob[:12]  # same magic and version
    with pytest.raises(UserError, match="other queries"):
        Engine(build_plan(parse("PATTERN SEQ(T0 a, T1 b) WITHIN 5").queries)).restore(blob)
    # the same queries with joins built on demand keep other queues: not restorable
    other = build_plan(parse(QUERIES).queries, materialize="on-demand")
    assert any(other.on_demand)
    with pytest.raises(UserError, match="planned otherwise"):
        Engine(other).restore(blob)
    with pytest.raises(UserError, match="not a dqcep engine snapshot"):
        Engine(plan).restore(b"nonsense")


def test_joins_built_on_demand_keep_no_batch_alive():
    """A chain built on demand holds its batch's arrays only while it builds: after
    the stream, nothing of the batches is left but the state (checked with the
    cyclic garbage collector off, which would otherwise hide a reference cycle)."""
    import gc
    import tracemalloc
    plan = build_plan(parse("PATTERN SEQ(T0 a, T1 b, T2 c, T3 d) WHERE [key] "
                            "WITHIN 100 ms").queries, materialize="on-demand")
    assert sum(plan.on_demand) == 2
    batches = list(generate(GeneratorConfig(
        profile="uniform", events=100_000, seed=1, profile_config=UniformConfig(
            types=4, keys=20, attributes=1, domain=10, event_rate=1000)), 5_000))
    engine = Engine(plan)
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        matches = sum(len(engine.process(b)) for b in batches) + len(engine.flush())
        left = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
        gc.enable()
    assert matches > 1000
    assert left < 200_000, f"{left:,} bytes of the batches outlived them"


def test_one_program_runs_many_states_and_restoring_compiles_nothing(monkeypatch):
    """program x state x columns -> matches: the program is compiled once, each key's
    state is restored from bytes into an engine without compiling anything."""
    import dqcep.runtime.program as program_module
    from dqcep.runtime import EngineState, Program, program_for

    program = program_for(QUERIES)
    assert program_for(QUERIES) is program  # cached per process
    batches = list(uniform_stream(20_000))
    whole, _ = run_events(build_plan(parse(QUERIES).queries), batches)
    # Two keys' streams interleaved through one program: each state sees only its own.
    states = {0: EngineState.fresh(program), 1: EngineState.fresh(program)}
    got = {0: MatchBatch(program.match_queries), 1: MatchBatch(program.match_queries)}
    blobs = {}
    for i, b in enumerate(batches):
        key = 0
        engine = Engine(program, state=states[key] if key not in blobs else
                        EngineState.from_bytes(program, blobs[key]))
        got[key] += engine.process(b)
        blobs[key] = engine.snapshot()
        if i == 0:  # from now on nothing may compile: restoring is bytes -> arrays
            def no_compiling(*args, **kwargs):
                raise AssertionError("compiled during a restore")
            monkeypatch.setattr(program_module, "predicate_set", no_compiling)
            monkeypatch.setattr(program_module.Program, "__init__", no_compiling)
        Engine(program, state=states[1]).process(batches[0] if i == 0 else [])
    last = Engine(program, state=EngineState.from_bytes(program, blobs[0]))
    got[0] += last.flush()
    assert matches_of(got[0]) == matches_of(whole)
    assert states[1].events_in == len(batches[0])
    assert isinstance(program, Program) and last.program is program


def test_state_stays_bounded_on_a_long_stream():
    plan = build_plan(parse(QUERIES).queries)
    engine = Engine(plan)
    sizes = []
    for i, batch in enumerate(uniform_stream(400_000, seed=3)):
        engine.process(batch)
        if i % 50 == 49:
            sizes.append(engine.state_bytes())
    engine.flush()
    assert len(sizes) == 8
    assert max(sizes[1:]) <= 1.2 * min(sizes[1:]), sizes  # flat, not growing with length
    assert len(engine.store) < 2_000                       # a few windows of events
    assert sum(s.evictions for s in engine.stats.values()) > 100_000


def test_the_store_keeps_events_as_long_as_a_record_may_read_them():
    # A's records wait in the join's queue one window; N is under a NOT that names none
    # of its attributes (its store holds ids, not attributes): one window, not four
    program = Program(build_plan(parse(
        "QUERY q PATTERN SEQ(A a, NOT N n, B b) WHERE [k] WITHIN 1 s").queries))
    assert program.store_retention == 1_000 + 2
    # a NOT that reads its events' attributes reads them for two of its windows
    reads = Program(build_plan(parse(
        "QUERY q PATTERN SEQ(A a, NOT N n, B b) WHERE n.x > a.x WITHIN 1 s").queries))
    assert reads.store_retention == 2 * 1_000 + 1 + 2
    # a record of two events (SEQ(A, B) waiting for C) starts up to a window before it ends
    chain = Program(build_plan(parse("QUERY q PATTERN SEQ(A a, B b, C c) WITHIN 1 s").queries))
    assert chain.store_retention == 2 * 1_000 + 2
    engine = Engine(program)
    for t in range(0, 20_000, 10):
        engine.process([Event(t, "ANB"[t // 10 % 3], t, {"k": t % 7})])
    assert engine.wm - engine.store.ts_of(np.array([engine.store.base]))[0] <= 1_002 + 10


def test_return_values_keep_what_the_engine_keeps():
    # a match held for its trailing NOT names events the store pins past its reach
    from dqcep.runtime import ReturnValues
    queries = parse("QUERY q PATTERN SEQ(A a, B b, NOT C c) WHERE [k] WITHIN 1 s "
                    "RETURN a.x, b.x").queries
    engine = Engine(build_plan(queries))
    returns = ReturnValues(queries, engine)
    found = []
    batches = [[Event(1, "A", 0, {"k": 1, "x": 5}), Event(2, "B", 10, {"k": 1, "x": 6})]]
    batches += [[Event(i, "A", 40 * i, {"k": 2, "x": i})] for i in range(3, 200)]
    for batch in batches:
        returns.remember(batch)  # (forgets what the engine forgot before this batch)
        assert min(ts for ts, _ in returns.order) >= (engine.kept_since or 0)
        found += [returns.fill(m) for m in engine.process(batch).to_matches()]
    assert [(m.events, m.returns) for m in found] == [
        ((("a", 1), ("b", 2)), (("a.x", 5), ("b.x", 6)))]
    assert len(returns.events) < 40  # one window of A events, not the stream


def test_an_adaptive_engine_keeps_what_a_move_replays():
    # joins keep SEQ(A, B)'s A events one window; the chain's runs reach two: the
    # engine that may move keeps two from the start (a move's replay rebuilds the runs)
    from dqcep.runtime.adapt import AdaptiveEngine
    queries = parse("QUERY q PATTERN SEQ(A a, B b) WHERE b.x > a.x WITHIN 1 s").queries
    joins = Program(build_plan(queries, constructions={"q": "joins"}))
    chain = Program(build_plan(queries, constructions={"q": "chain"}))
    assert joins.store_retention < chain.store_retention
    engine = AdaptiveEngine(queries, constructions={"q": "joins"})
    assert engine.constructions == {"q": "joins"}
    assert engine.store_retention == chain.store_retention
    assert engine.switch("q", "chain") and engine.store_retention == chain.store_retention
    assert engine.switch("q", "joins") and engine.store_retention == chain.store_retention


def test_agrees_with_reference_on_a_generated_stream():
    assert_agrees_with_reference(parse(QUERIES).queries, 8_000, seed=5, at_least=100)


def assert_agrees_with_reference(queries, n, seed, at_least):
    """The native engine and the reference on a uniform stream of n events."""
    batches = list(uniform_stream(n, seed=seed))
    events = [e for b in batches for e in b.to_events()]
    expected = {(m.query, m.events, m.detected_at) for m in ReferenceMatcher(queries).run(events)}
    got, _ = run_events(build_plan(queries), batches)
    assert matches_of(got) == expected and len(expected) > at_least


def test_watermark_releases_held_matches_and_late_events_are_counted():
    plan = build_plan(parse("PATTERN SEQ(A a, B b, NOT C c) WITHIN 10").queries)
    e = Engine(plan)
    assert len(e.process([Event(1, "A", 0), Event(2, "B", 5)])) == 0  # held until ts > 10
    assert len(e.advance_watermark(10)) == 0
    assert [m.detected_at for m in e.advance_watermark(11).to_matches()] == [10]
    e.process([Event(3, "A", 20)])
    assert len(e.process([Event(4, "B", 19)])) == 0
    assert e.late == 1 and e.take_late() == [4] and e.take_late() == []
    with pytest.raises(UserError, match="lateness must be >= 0"):
        Engine(plan, lateness=-1)


def test_equality_conjunct_becomes_the_join_key():
    text = ("PATTERN SEQ(T0 a, OR(T1 b, T2 c), T1 d) WHERE a.key = d.key AND b.a0 = a.a0 "
            "WITHIN 50 ms")
    queries = parse(text).queries
    engine = Engine(build_plan(queries))
    (v, index), = engine.program.eq_index.items()      # a.key = d.key only: b sits under an OR
    assert engine.plan.label(v) == "SEQ" and index[0] == 0 and index[2] == 0
    assert_agrees_with_reference(queries, 6_000, seed=7, at_least=50)


def test_kernel_constants_mirror_the_python_ones():
    from dqcep._kernels.store import KINDS, OPCODES
    from dqcep.plan.bytecode import Op
    from dqcep.runtime import compile as rc
    assert OPCODES == {op.name: int(op) for op in Op}
    assert KINDS == {"MISSING": rc.KIND_MISSING, "NUM": rc.KIND_NUM, "STR": rc.KIND_STR,
                     "BOOL": rc.KIND_BOOL, "ATTR_TS": rc.ATTR_TS, "ATTR_ID": rc.ATTR_ID,
                     "MAX_STACK": rc.MAX_STACK}


def test_next_release_is_when_a_held_match_comes_out():
    plan = build_plan(parse("PATTERN SEQ(A a, B b, NOT C c) WITHIN 10").queries)
    e = Engine(plan)
    assert e.next_release() is None
    e.process([Event(1, "A", 3), Event(2, "B", 5)])
    assert e.next_release() == 14  # start 3 + W 10 + 1
    assert len(e.advance_watermark(13)) == 0
    assert [m.detected_at for m in e.advance_watermark(14).to_matches()] == [13]
    assert e.next_release() is None


def test_restore_replaces_the_column_decoder_with_the_dictionary():
    import msgpack
    plan = build_plan(parse("PATTERN SEQ(A a, B b) WHERE a.s = 'x' WITHIN 10").queries)
    old, new = Engine(plan), Engine(plan)
    old.process([Event(1, "A", 0, {"s": "y"})])          # "y" gets a code in old only
    decoder = new.column_decoder()
    assert new.column_decoder() is decoder               # one per engine
    new.restore(old.snapshot())
    fresh = new.column_decoder()
    assert fresh is not decoder
    fresh.decode(msgpack.packb({"type": "A", "ts": 5, "id": 2, "s": "y"}))
    *_, val, kind = fresh.take()
    assert new.dictionary.values[int(val[0, new.attr_index["s"]])] == "y"


@pytest.mark.integration
def test_the_embedding_example_in_the_docs_runs_as_written():
    """docs/runtime.md's first code block is a complete program: run it, and its lines
    are the reference's matches with their RETURN values (issue 15, item 7)."""
    import re
    import subprocess
    import sys

    from dqcep.io.readers import read_events
    from dqcep.lang import parse_file
    from dqcep.baseline.reference import ReferenceMatcher
    root = ROOT
    program = re.search(r"```python\n(.*?)```", (root / "docs" / "runtime.md").read_text(),
                        re.S).group(1)
    r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                       cwd=root)
    assert r.returncode == 0, r.stderr
    queries = parse_file(root / "examples" / "fire.cep").queries
    events = [e for _, e in read_events(str(root / "examples" / "fire-events.jsonl"))]
    by_id = {e.id: e for e in events}
    specs = {q.name: q.returns for q in queries}

    def returned(m):  # RETURN by its definition (docs/language.md), from the events
        bound = dict(m.events)
        return {r.var if r.attr is None else f"{r.var}.{r.attr}":
                None if r.var not in bound else
                bound[r.var] if r.attr is None else by_id[bound[r.var]].attrs.get(r.attr)
                for r in specs[m.query]}
    want = sorted(f"{m.query} {m.detected_at} {dict(m.events)} {returned(m)}"
                  for m in ReferenceMatcher(queries).run(events))
    assert sorted(r.stdout.splitlines()) == want and any("s.density" in x for x in want)


@pytest.mark.integration
def test_the_program_and_state_example_in_the_docs_runs_as_written():
    """docs/runtime.md's Program / EngineState block runs as written."""
    import re
    import subprocess
    import sys

    root = ROOT
    blocks = re.findall(r"```python\n(.*?)```", (root / "docs" / "runtime.md").read_text(), re.S)
    (example,) = [b for b in blocks if "EngineState.from_bytes" in b]
    r = subprocess.run([sys.executable, "-c", example + "\nprint(type(engine.state).__name__)"],
                       capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["EngineState"]


def test_an_engine_keeps_no_array_of_the_callers_batch():
    """Events the lateness holds back outlive the call that brought them (a batch in
    ts order is taken as it is): a caller that then reuses its column arrays, as a
    decoder may its buffers, changes no match, native or SASE."""
    from dqcep.baseline import SaseEngine
    q = parse("QUERY s PATTERN SEQ(A a, B b) WITHIN 1 s").queries
    events = [Event(1, "A", 10, {}), Event(2, "B", 20, {}), Event(3, "A", 30, {}),
              Event(4, "B", 40, {})]
    expected = sorted(m.events for m in ReferenceMatcher(q).run(events))
    for engine in (Engine(build_plan(q), lateness=100), SaseEngine(q, lateness=100)):
        cols = engine.columns(events)
        out = engine.process(cols)
        assert not len(out)  # all four held by the lateness
        for column, value in zip(cols, (0, 0, -1, 0.0, 0)):
            column[...] = value
        out += engine.flush()
        assert sorted(m.events for m in out.to_matches()) == expected, type(engine)
