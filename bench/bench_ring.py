"""RingBuffer throughput: the Cython circular queue against a deque of tuples.

Both run the same workload in one process: push N partial-match records in
batches, then evict them from the head as a watermark advances. Prints
records/s for each and the ratio (this machine is shared: compare ratios).

    python3 bench/bench_ring.py [--records N] [--ids K] [--batch B]
"""
from __future__ import annotations

import argparse
import time
from collections import deque

import numpy as np

from dqcep._kernels.ring import RingBuffer


def workload(n: int, k: int, batch: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.integers(0, 3, n)).astype(np.int64)
    ends = starts + rng.integers(0, 5, n)
    keys = rng.integers(0, 1000, n).astype(np.int64)
    ids = rng.integers(0, 2**40, (n, k)).astype(np.int64)
    return [(starts[i:i + batch], ends[i:i + batch], keys[i:i + batch], ids[i:i + batch])
            for i in range(0, n, batch)]


def run_ring(batches, k, window):
    ring = RingBuffer(k)
    for starts, ends, keys, ids in batches:
        ring.push_batch(starts, ends, keys, ids)
        ring.evict_before(int(starts[-1]) - window)
    return ring.high_water


def run_deque(batches, k, window):
    q, high = deque(), 0
    for starts, ends, keys, ids in batches:
        for row in zip(starts.tolist(), ends.tolist(), keys.tolist(), map(tuple, ids.tolist())):
            q.append(row)
        high = max(high, len(q))  # the ring's high-water mark is taken at push time too
        cutoff = int(starts[-1]) - window
        while q and q[0][0] < cutoff:
            q.popleft()
    return high


def timed(fn, *args, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best, result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--ids", type=int, default=3, help="event-id slots per record")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--window", type=int, default=1000, help="ts units kept behind the tail")
    args = ap.parse_args(argv)
    batches = workload(args.records, args.ids, args.batch)
    t_ring, high_ring = timed(run_ring, batches, args.ids, args.window)
    t_deque, high_deque = timed(run_deque, batches, args.ids, args.window)
    assert high_ring == high_deque, (high_ring, high_deque)
    n = args.records
    print(f"records={n} ids/record={args.ids} batch={args.batch} window={args.window} "
          f"(peak {high_ring} records held)")
    print(f"RingBuffer (Cython, nogil): {n / t_ring / 1e6:8.2f} M records/s  ({t_ring:.3f} s)")
    print(f"deque of tuples (Python):   {n / t_deque / 1e6:8.2f} M records/s  ({t_deque:.3f} s)")
    print(f"ratio ring/deque: {t_deque / t_ring:.1f}x")


if __name__ == "__main__":
    main()
