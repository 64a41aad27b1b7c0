"""Kleene lists: the list store (dqcep/_kernels/store.pyx) and the iteration kernel of
a KLEENE vertex (dqcep/_kernels/lists.pyx), against a model written from spec 5.1."""
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqcep._kernels.lists import kleene_step
from dqcep._kernels.ring import KeyedQueue, RingBuffer
from dqcep._kernels.store import EventStore, ListStore
from dqcep.lang import parse
from dqcep.runtime.compile import StringDictionary, kleene_sets
from tests.support.examples import examples

NUM, MISSING = 1, 0


def store_of(rows):
    """rows: (ts, id, value or None) in ts order -> EventStore with one column."""
    st_ = EventStore(1)
    st_.append(np.array([r[0] for r in rows], np.int64), np.array([r[1] for r in rows], np.int64),
               np.array([[r[2] if r[2] is not None else 0.0] for r in rows],
                        np.float64).reshape(-1, 1),
               np.array([[NUM if r[2] is not None else MISSING] for r in rows],
                        np.int8).reshape(-1, 1))
    return st_


def test_a_list_is_its_last_node_and_keeps_its_aggregates():
    st_ = store_of([(10, 100, 3.0), (11, 101, 1.0), (12, 102, None), (13, 103, 5.0)])
    ls = ListStore([0])
    a = ls.py_append(st_, -1, 0)
    ab = ls.py_append(st_, a, 1)
    abd = ls.py_append(st_, ab, 3)
    ac = ls.py_append(st_, a, 2)          # prefixes are shared: a list is one node
    assert list(ls.elements(abd)) == [0, 1, 3] and list(ls.elements(ac)) == [0, 2]
    assert ls.info(abd) == {"count": 3, "first": 0, "start": 10, "end": 13, "last": 3,
                            "parent": ab}
    assert [ls.aggregate(abd, 0, f) for f in ("count", "sum", "avg", "min", "max")] == [
        3, 9.0, 3.0, 1.0, 5.0]
    assert ls.aggregate(ac, 0, "sum") is None and ls.aggregate(ac, 0, "count") == 2
    assert ls.nbytes == 4 * (6 * 8 + 25)


def test_list_store_evicts_the_oldest_and_keeps_handles():
    rows = [(t, t, float(t)) for t in range(5000)]
    st_ = store_of(rows)
    ls = ListStore([0])
    h = -1
    for t in range(5000):
        h = ls.py_append(st_, h if t % 10 else -1, t)  # runs of ten
        ls.py_evict_end_before(t - 30)
    assert ls.evicted > 4900 and len(ls.elements(h)) == 10
    assert ls.aggregate(h, 0, "sum") == float(sum(range(4990, 5000)))
    with pytest.raises(IndexError, match="not kept"):
        ls.info(0)
    assert ls.high_water < 64  # eviction keeps the arrays small


def test_list_store_dump_and_load_give_the_same_lists_and_go_on():
    rows = [(t, 100 + t, float(t) if t % 3 else None) for t in range(40)]
    st_ = store_of(rows)
    ls = ListStore([0])
    handles, h = [], -1
    for t in range(40):
        h = ls.py_append(st_, h if t % 7 else -1, t)
        handles.append(h)
        ls.py_evict_end_before(t - 12)
    other = ListStore([0])
    other.load(*ls.dump())
    assert (other.evicted, other.size) == (ls.evicted, ls.size)
    # lists none of whose nodes were evicted (a run's nodes are consecutive here)
    whole = [h for h in handles[-ls.size:] if h - ls.info(h)["count"] + 1 >= ls.evicted]
    assert len(whole) > 5
    with pytest.raises(IndexError, match="no longer kept"):
        ls.elements(handles[-ls.size])  # its run began before the oldest node kept
    with pytest.raises(IndexError, match="no longer kept"):
        ls.elements_of(np.array([handles[-ls.size]], np.int64))
    offsets, seqs = other.elements_of(np.array(whole, np.int64))  # all at once
    for i, h in enumerate(whole):
        assert list(other.elements(h)) == list(ls.elements(h))
        assert list(seqs[offsets[i]:offsets[i + 1]]) == list(ls.elements(h))
        assert other.info(h) == ls.info(h)
        assert [other.aggregate(h, 0, f) for f in ("sum", "min", "max", "count")] == [
            ls.aggregate(h, 0, f) for f in ("sum", "min", "max", "count")]
    assert other.py_append(st_, handles[-1], 39) == ls.py_append(st_, handles[-1], 39)


def kernel_preds(text):
    """The PredicateSets kleene_step takes for the KLEENE vertex of a one-query file."""
    from dqcep.plan import Kind, build_plan
    plan = build_plan(parse(text).queries)
    (kv,) = [v for v in range(plan.n_vertices) if plan.kind(v) == Kind.KLEENE]
    names = ("pairs", "first", "whole", "whole_each", "whole_pairs")
    return dict(zip(names, kleene_sets(plan.preds[kv], {"x": 0}, StringDictionary())))


def model(rows, keys, window, pair_ok, first_ok, whole_ok):
    """Every list by spec 5.1: same key, strictly increasing ts, span <= window."""
    out = set()
    idx = range(len(rows))
    for r in range(1, len(rows) + 1):
        for combo in itertools.combinations(idx, r):
            ts = [rows[i][0] for i in combo]
            if len({keys[i] for i in combo}) > 1 or any(b <= a for a, b in zip(ts, ts[1:])):
                continue
            if ts[-1] - ts[0] > window or not first_ok(rows[combo[0]]):
                continue
            if not all(pair_ok(rows[b], rows[a], rows[combo[0]]) for a, b in zip(combo, combo[1:])):
                continue
            if whole_ok([rows[i] for i in combo]):
                out.add(combo)
    return out


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([1, 0, 1, 2]), st.sampled_from([0, 1]),
                          st.one_of(st.none(), st.integers(0, 4))), min_size=1, max_size=11),
       st.integers(1, 6), st.integers(1, 4), st.sampled_from(["none", "rising", "first", "sum", "each"]))
def test_kleene_step_makes_every_list_of_spec_5_1(steps, window, cut, conditions):
    rows, keys, t = [], [], 0
    for i, (gap, key, value) in enumerate(steps):
        t += gap
        rows.append((t, 1000 + i, None if value is None else float(value)))
        keys.append(key)
    where = {"none": "", "rising": "WHERE v[i].x > v[i-1].x",
             "first": "WHERE v[1].x >= 1 AND v[i].x >= v[1].x",
             "sum": "WHERE sum(v.x) >= 3 AND v[last].x > 0",
             "each": "WHERE v.x >= avg(v.x) - 1 AND v[i].x + count(v) > v[i-1].x + 2"}[
                 conditions]
    sets = kernel_preds(f"PATTERN SEQ(T+ v[], U u) {where} WITHIN {window}")
    has = lambda r: r[2] is not None  # noqa: E731
    pair_ok = {"none": lambda c, p, f: True,
               "rising": lambda c, p, f: has(c) and has(p) and c[2] > p[2],
               "first": lambda c, p, f: has(c) and has(f) and c[2] >= f[2],
               "sum": lambda c, p, f: True, "each": lambda c, p, f: True}[conditions]
    first_ok = (lambda f: has(f) and f[2] >= 1) if conditions == "first" else (lambda f: True)

    def whole_ok(lst):
        if conditions == "sum":
            return all(map(has, lst)) and sum(r[2] for r in lst) >= 3 and lst[-1][2] > 0
        if conditions == "each":  # every element against the complete list's aggregates
            if not all(map(has, lst)):
                return False
            avg, n = sum(r[2] for r in lst) / len(lst), len(lst)
            return all(r[2] >= avg - 1 for r in lst) and all(
                c[2] + n > p[2] + 2 for p, c in zip(lst, lst[1:]))
        return True
    expected = model(rows, keys, window, pair_ok, first_ok, whole_ok)

    st_ = store_of(rows)
    ls = ListStore([0])
    growing, out = KeyedQueue(1), RingBuffer(1)
    seqs = np.arange(len(rows), dtype=np.int64)
    ts = np.array([r[0] for r in rows], np.int64)
    k = np.array(keys, np.int64)
    got = set()
    for lo in range(0, len(rows), cut):  # batches; between them the queue is pruned
        hi = min(lo + cut, len(rows))
        out.reset()
        kleene_step(ls, st_, growing, window, seqs[lo:hi], ts[lo:hi], k[lo:hi],
                    sets["pairs"], sets["first"], sets["whole"], sets["whole_each"],
                    sets["whole_pairs"], out)
        starts, ends, ks, ids = out.to_arrays()
        for start, end, key, h in zip(starts.tolist(), ends.tolist(), ks.tolist(),
                                      ids[:, 0].tolist()):
            elements = tuple(int(s) for s in ls.elements(h))
            assert (start, end) == (rows[elements[0]][0], rows[elements[-1]][0])
            assert key == keys[elements[0]]
            got.add(elements)
        growing.py_evict_end_before(int(ts[hi - 1]) - window)
    assert got == expected
