"""The chain kernel where it is entered (dqcep/_kernels/chains.pyx): what it refuses,
its state's round trip, and its two outputs agreeing. Its matches are held against
the reference by the differential tests (tests/runtime/test_native.py, every check())."""
from __future__ import annotations

import numpy as np
import pytest

from dqcep._kernels.chains import ChainSpec, ChainStacks, chain_step, chain_step_ids
from dqcep._kernels.ring import RingBuffer, StateBudgetExceeded
from dqcep._kernels.store import EventStore, ListStore
from dqcep.lang import parse
from dqcep.plan import Kind, build_plan
from dqcep.runtime.compile import StringDictionary, chain_placement, chain_spec


def spec_of(text: str):
    plan = build_plan(parse(text).queries, materialize="chain")
    (v,) = [v for v in range(plan.n_vertices) if plan.kind(v) == Kind.RUN]
    attrs = {"x": 0}
    return plan, v, chain_spec(plan.run[v], plan.preds[v], plan.key_attrs[v],
                               int(plan.window[v]), attrs, StringDictionary((), 0))


def test_the_spec_refuses_groups_that_do_not_bound_the_conditions():
    plan, v, spec = spec_of("QUERY q PATTERN SEQ(A a, B+ b[], C c) WHERE b.x > a.x "
                            "WITHIN 10 ms")
    ordered, groups = chain_placement(plan.preds[v], plan.run[v].kleene)
    with pytest.raises(ValueError, match="group_first must bound every condition"):
        ChainSpec(10, [0, 1, 2], [0, 1, 0], spec.conds, groups[:-1], [])
    with pytest.raises(ValueError, match="must not decrease"):
        ChainSpec(10, [0, 1, 2], [0, 1, 0], spec.conds, [0, 1] + [0] * 8 + [1], [])
    # the condition ranges over b: a chain whose b is no Kleene slot cannot hold it
    with pytest.raises(ValueError, match="holds no list"):
        ChainSpec(10, [0, 1, 2], [0, 0, 0], spec.conds, groups, [])
    with pytest.raises(ValueError, match="1..32 slots"):
        ChainStacks(0)
    with pytest.raises(ValueError, match="one kind per slot"):
        ChainStacks(3, [0, 1])


def events(store: EventStore, rows):
    """Append (type, ts, x) rows; returns seqs, ts, types."""
    ts = np.array([r[1] for r in rows], np.int64)
    ids = np.arange(1, len(rows) + 1, dtype=np.int64)
    val = np.array([[r[2]] for r in rows], np.float64)
    kind = np.ones((len(rows), 1), np.int8)
    first = store.append(ts, ids, val, kind)
    return (np.arange(first, first + len(rows), dtype=np.int64), ts,
            np.array([r[0] for r in rows], np.int32))


def test_stacks_round_trip_and_both_outputs_agree():
    """Stacks dumped and loaded go on as the original (pointers rebuilt); the ring's
    matches and chain_step_ids's ids are the same matches."""
    _, _, spec = spec_of("QUERY q PATTERN SEQ(A a, B b, C c) WITHIN 10 ms")
    rows = [(0, 1, 0), (1, 2, 0), (0, 3, 0), (1, 4, 0), (2, 5, 0), (0, 6, 0), (1, 7, 0),
            (2, 8, 0)]
    runs = []
    for cut in (0, 3, 5):
        store, lists = EventStore(1), ListStore()
        seqs, ts, types = events(store, rows)
        zeros, ok = np.zeros(len(rows), np.int64), np.ones(len(rows), np.uint8)
        stacks = ChainStacks(3, [0, 0, 0])
        ring = RingBuffer(3, 16)
        chain_step(spec, stacks, store, lists, seqs[:cut], ts[:cut], types[:cut],
                   zeros[:cut], ok[:cut], ring)
        again = ChainStacks(3, [0, 0, 0])
        again.load(stacks.dump())
        assert again.live == stacks.live
        chain_step(spec, again, store, lists, seqs[cut:], ts[cut:], types[cut:],
                   zeros[cut:], ok[cut:], ring)
        s, e, k, ids = ring.to_arrays()
        runs.append(sorted(map(tuple, store.ids_of(np.ascontiguousarray(ids)).tolist())))
        stacks = ChainStacks(3, [0, 0, 0])
        detected, direct = chain_step_ids(spec, stacks, store, lists, seqs, ts, types, zeros,
                                          ok, np.array([0, 1, 2], np.int64), 0)
        assert sorted(map(tuple, direct.tolist())) == runs[-1]
        assert sorted(detected.tolist()) == sorted(e.tolist())
    assert runs[0] == runs[1] == runs[2] == [(1, 2, 5), (1, 2, 8), (1, 4, 5), (1, 4, 8),
                                              (1, 7, 8), (3, 4, 5), (3, 4, 8), (3, 7, 8),
                                              (6, 7, 8)]
    with pytest.raises(StateBudgetExceeded):
        chain_step_ids(spec, ChainStacks(3, [0, 0, 0]), store, lists, seqs, ts, types, zeros,
                       ok, np.array([0, 1, 2], np.int64), 4)
    with pytest.raises(ValueError, match="stacks were made for a chain of other slot kinds"):
        chain_step_ids(spec, ChainStacks(3, [0, 1, 0]), store, lists, seqs, ts, types, zeros,
                       ok, np.array([0, 1, 2], np.int64), 0)


def list_matches(text, rows, cut=None):
    """(matches as (a id, b ids, c id), list nodes made) of a 3-slot chain with a
    Kleene middle over (type, ts, x) rows, in one call or two (``cut``)."""
    _, _, spec = spec_of(text)
    store, lists = EventStore(1), ListStore()
    seqs, ts, types = events(store, rows)
    zeros, ok = np.zeros(len(rows), np.int64), np.ones(len(rows), np.uint8)
    stacks, ring = ChainStacks(3, [0, 1, 0]), RingBuffer(3, 64)
    for a, b in ((0, len(rows)),) if cut is None else ((0, cut), (cut, len(rows))):
        chain_step(spec, stacks, store, lists, seqs[a:b], ts[a:b], types[a:b], zeros[a:b],
                   ok[a:b], ring)
    _, _, _, recs = ring.to_arrays()

    def user_ids(seqs):
        return store.ids_of(np.asarray(seqs, np.int64).reshape(1, -1))[0].tolist()
    offsets, elements = lists.elements_of(np.ascontiguousarray(recs[:, 1]))
    made = sorted((user_ids([r[0]])[0],
                   tuple(user_ids(elements[offsets[i]:offsets[i + 1]])),
                   user_ids([r[2]])[0]) for i, r in enumerate(recs.tolist()))
    return made, lists.size


def test_a_middle_list_is_made_once_per_binding_before_it():
    """The lists of a Kleene slot whose conditions read only the slots before it
    depend on that binding and on the bound after it: the chain keeps them per
    binding within a call, and a later last event extends them (2 c events after
    a, b2, b3: 3 lists made, not 3 per c). A condition on the slot after it (c) makes
    them per match as before. The matches are the same (held against the
    reference by tests/runtime/test_native.py's chain and hypothesis tests)."""
    rows = [(0, 1, 5), (1, 2, 6), (1, 3, 7), (2, 4, 0), (1, 4, 8), (2, 5, 0), (2, 6, 0)]
    want = sorted((1, bs, c) for c in (4, 6, 7) for bs in ((2,), (3,), (2, 3))) + \
        [(1, (5,), 6), (1, (5,), 7), (1, (2, 5), 6), (1, (2, 5), 7), (1, (3, 5), 6),
         (1, (3, 5), 7), (1, (2, 3, 5), 6), (1, (2, 3, 5), 7)]
    want = sorted(want)
    left = "QUERY q PATTERN SEQ(A a, B+ b[], C c) WHERE b.x > a.x WITHIN 10 ms"
    made, nodes = list_matches(left, rows)
    assert made == want
    assert nodes == 7          # b2, b3, b2b3, b5, b2b5, b3b5, b2b3b5: each once
    assert list_matches(left, rows, cut=4)[0] == want  # a later call makes them anew
    right = "QUERY q PATTERN SEQ(A a, B+ b[], C c) WHERE b.x > c.x WITHIN 10 ms"
    made, nodes = list_matches(right, rows)
    assert made == want and nodes == 3 + 7 + 7   # per c: 3 lists, then 7 and 7
