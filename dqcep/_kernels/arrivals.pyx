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


cdef class ArrivalIndex:
    """ArrivalIndex(ids, arrival): a batch's events by id (``arrival[i]`` when event
    ``ids[i]`` arrived, NaN: unknown), built once a batch for every query's matches."""

    cdef Int64Table table
    cdef const double[::1] arrival
    cdef bint ready

    def __cinit__(self, const int64_t[::1] ids, const double[::1] arrival):
        cdef idx_t i, n = ids.shape[0]
        if arrival.shape[0] != n:
            raise ValueError("ids and arrival differ in length")
        self.arrival = arrival
        table_init(&self.table, 2 * n)
        self.ready = True
        with nogil:
            for i in range(n):
                if ids[i] >= 0:
                    table_set(&self.table, ids[i], i)

    def __dealloc__(self):
        if self.ready:
            table_free(&self.table)

    def latest(self, const int64_t[:, ::1] candidates):
        """float64 per row of ``candidates`` (match x its candidate ids, -1: none): the
        latest known arrival of the candidates that are in the batch; -inf when none
        is, or none of their arrivals is known."""
        cdef idx_t rows = candidates.shape[0], width = candidates.shape[1], r, c
        cdef int64_t at, x
        cdef double best, t
        out = np.empty(rows, np.float64)
        cdef double[::1] latest = out
        with nogil:
            for r in range(rows):
                best = -INFINITY
                for c in range(width):
                    x = candidates[r, c]
                    if x >= 0:
                        at = table_get(&self.table, x)
                        if at >= 0:
                            t = self.arrival[at]
                            if t > best:  # (NaN: never)
                                best = t
                latest[r] = best
        return out
