"""RingBuffer kernel, tested through its Python API against a deque model."""
from collections import deque

import numpy as np
import pytest

from dqcep._kernels.ring import RingBuffer


def records(rng, n, n_ids, t0=0):
    starts = t0 + np.cumsum(rng.integers(0, 5, n)).astype(np.int64)
    ends = starts + rng.integers(0, 10, n)
    keys = rng.integers(-(2**40), 2**40, n)
    ids = rng.integers(0, 2**62, (n, n_ids))
    return starts, ends, keys, ids


def test_fifo_order_and_fields():
    r = RingBuffer(3)
    r.push(5, 9, -7, [1, 2, 3])
    r.push(6, 6, 0, (4, 5, 6))
    assert len(r) == 2
    assert r[0] == (5, 9, -7, (1, 2, 3))
    assert r[-1] == (6, 6, 0, (4, 5, 6))
    assert r.pop() == 1
    assert r[0] == (6, 6, 0, (4, 5, 6))


@pytest.mark.parametrize("n_ids", [0, 1, 4])
def test_random_operations_match_a_deque(n_ids):
    rng = np.random.default_rng(1234 + n_ids)
    ring, model = RingBuffer(n_ids, min_capacity=4), deque()
    t = 0
    for _ in range(300):
        op = rng.integers(0, 3)
        if op == 0:
            starts, ends, keys, ids = records(rng, int(rng.integers(0, 40)), n_ids, t)
            if len(starts):
                t = int(starts[-1])
            ring.push_batch(starts, ends, keys, ids)
            model.extend(zip(starts.tolist(), ends.tolist(), keys.tolist(),
                             map(tuple, ids.tolist())))
        elif op == 1:
            k = int(rng.integers(0, 30))
            assert ring.pop(k) == min(k, len(model))
            for _ in range(min(k, len(model))):
                model.popleft()
        else:
            cutoff = t - int(rng.integers(0, 40))
            expect = 0
            while model and model[0][0] < cutoff:
                model.popleft()
                expect += 1
            assert ring.evict_before(cutoff) == expect
        assert len(ring) == len(model)
        assert ring.capacity & (ring.capacity - 1) == 0
        assert ring.capacity >= len(ring)
        starts, ends, keys, ids = ring.to_arrays()
        assert list(zip(starts.tolist(), ends.tolist(), keys.tolist(),
                        map(tuple, ids.tolist()))) == list(model)


def test_grows_by_doubling_and_shrinks_back():
    r = RingBuffer(2, min_capacity=8)
    assert r.capacity == 8
    n = 1000
    z = np.arange(n, dtype=np.int64)
    r.push_batch(z, z, z, np.stack([z, z], axis=1))
    assert r.capacity == 1024 and r.high_water == n
    assert r.nbytes == 1024 * 5 * 8
    r.evict_before(990)
    assert len(r) == 10
    # halves while at most a quarter full: 1024 -> 32 for 10 records
    assert r.capacity == 32
    assert r[0][0] == 990 and r.high_water == n
    r.clear()
    assert len(r) == 0 and r.capacity == 8


def test_wraparound_keeps_order():
    r = RingBuffer(1, min_capacity=4)
    seen = []
    for i in range(50):
        r.push(i, i, 0, [i])
        if i % 3 == 0:
            seen.append(r[0][3][0])
            r.pop()
    rest = [r[i][3][0] for i in range(len(r))]
    assert seen + rest == list(range(50))


def test_read_only_inputs_are_accepted():
    rng = np.random.default_rng(7)
    arrays = records(rng, 20, 2)
    for a in arrays:
        a.setflags(write=False)
    r = RingBuffer(2)
    r.push_batch(*arrays)
    assert len(r) == 20


def test_evict_stops_at_first_record_inside_window():
    r = RingBuffer(0)
    for s in (1, 5, 2, 9):
        r.push(s, s, 0, [])
    assert r.evict_before(4) == 1      # 5 is inside, so 2 behind it waits
    assert r[0][0] == 5


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="n_ids must be >= 0"):
        RingBuffer(-1)
    with pytest.raises(ValueError, match="min_capacity must be >= 1"):
        RingBuffer(1, min_capacity=0)
    r = RingBuffer(2)
    with pytest.raises(ValueError, match="expected 2 event ids, got 3"):
        r.push(0, 0, 0, [1, 2, 3])
    z = np.zeros(3, dtype=np.int64)
    with pytest.raises(ValueError, match="disagree in length"):
        r.push_batch(z, z[:2], z, np.zeros((3, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="ids must have 2 columns"):
        r.push_batch(z, z, z, np.zeros((3, 1), dtype=np.int64))
    with pytest.raises(ValueError, match="Buffer dtype mismatch"):
        r.push_batch(z.astype(np.float64), z, z, np.zeros((3, 2), dtype=np.int64))
    with pytest.raises(IndexError, match="out of range"):
        r[5]
    with pytest.raises(ValueError, match="negative"):
        r.pop(-1)


def test_keyed_queue_load_equals_appending_one_by_one():
    """A snapshot's queue restored in one call has the records and key chains of the
    queue built by appends (the engine restores queues this way)."""
    from dqcep._kernels.ring import KeyedQueue
    rng = np.random.default_rng(5)
    n, n_ids = 500, 2
    starts = np.sort(rng.integers(0, 10_000, n)).astype(np.int64)
    ends = starts + 5
    keys = rng.integers(0, 7, n).astype(np.int64)
    ids = rng.integers(0, 10**9, (n, n_ids)).astype(np.int64)
    one_by_one, loaded = KeyedQueue(n_ids), KeyedQueue(n_ids)
    one_by_one.py_set_evicted(40)
    for row in zip(starts.tolist(), ends.tolist(), keys.tolist(), ids.tolist()):
        one_by_one.py_append(*row)
    loaded.load(40, starts, ends, keys, ids)
    assert len(loaded) == n and loaded.evicted == 40
    assert [loaded.py_record(p) for p in range(40, 40 + n)] == \
        [one_by_one.py_record(p) for p in range(40, 40 + n)]
    for k in range(7):
        assert loaded.py_key_positions(k) == one_by_one.py_key_positions(k)
