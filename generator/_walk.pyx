"""Bounded random walks, one per source (device, symbol), advanced event by event.

The generator draws the steps with numpy; this kernel applies them in stream
order because each value depends on the previous value of the same source.
"""
from libc.stdint cimport int32_t

from dqcep._kernels._types cimport idx_t

import numpy as np


def reflected_walk(const int32_t[::1] source, const double[::1] steps, double[::1] state,
                   const double[::1] lo, const double[::1] hi):
    """Advance ``state[source[i]]`` by ``steps[i]``, reflecting at [lo, hi] of that source.

    Returns the value after each step; ``state`` is updated in place so the next
    chunk continues where this one stopped.
    """
    cdef idx_t n = source.shape[0], i
    cdef int32_t s
    cdef double v
    if steps.shape[0] != n:
        raise ValueError(f"source has {n} rows, steps has {steps.shape[0]}")
    out_arr = np.empty(n, dtype=np.float64)
    cdef double[::1] out = out_arr
    with nogil:
        for i in range(n):
            s = source[i]
            v = state[s] + steps[i]
            if v > hi[s]:
                v = 2 * hi[s] - v
            if v < lo[s]:
                v = 2 * lo[s] - v
            if v > hi[s]:       # a step longer than the interval: clamp
                v = hi[s]
            state[s] = v
            out[i] = v
    return out_arr
