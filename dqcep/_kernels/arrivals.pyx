"""Per match, when its latest event arrived: the service's response times.

A batch of events emits matches; a match's response time runs from the arrival of the
event that completed it, the latest-arriving of its events in the batch. With queries
that match often there are many more matches than events (10 example queries: 45 a
message), so the lookup of each match's candidates among the batch's ids is one nogil
pass over a hash table of the batch's ids (``_table.pxd``), not a sort or a binary
search per candidate.
"""
from libc.math cimport INFINITY
from libc.stdint cimport int64_t

import numpy as np

from dqcep._kernels._table cimport Int64Table, table_free, table_get, table_init, table_set
from dqcep._kernels._types cimport idx_t


def latest_arrivals(const int64_t[::1] ids, const double[::1] arrival,
                    const int64_t[:, ::1] candidates):
    """float64 per row of ``candidates`` (match x its candidate ids, -1: none): the
    latest ``arrival[i]`` of the candidates found as ``ids[i]``; -inf when none is found
    or none of their arrivals is known (NaN)."""
    cdef idx_t n = ids.shape[0], rows = candidates.shape[0], width = candidates.shape[1]
    cdef idx_t i, r, c
    cdef int64_t at, x
    cdef double best, t
    cdef Int64Table table
    out = np.empty(rows, np.float64)
    cdef double[::1] latest = out
    table_init(&table, 2 * n)
    try:
        with nogil:
            for i in range(n):
                if ids[i] >= 0:
                    table_set(&table, ids[i], i)
            for r in range(rows):
                best = -INFINITY
                for c in range(width):
                    x = candidates[r, c]
                    if x >= 0:
                        at = table_get(&table, x)
                        if at >= 0:
                            t = arrival[at]
                            if t > best:  # (NaN: never)
                                best = t
                latest[r] = best
    finally:
        table_free(&table)
    return out
