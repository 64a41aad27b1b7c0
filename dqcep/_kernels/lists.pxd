# Kleene lists (spec 5.1), stored once as nodes: a list is its last node, which points
# at the list without its last element. Aggregates are kept per node, incrementally.
from libc.stdint cimport int32_t, int64_t, uint8_t

from dqcep._kernels._types cimport idx_t, ts_t
from dqcep._kernels.store cimport EventStore


cdef class ListStore:
    cdef int64_t* seq           # per node: the last element's event sequence number
    cdef int64_t* parent        # per node: handle of the list without it, -1: none
    cdef int64_t* count         # per node: elements in the list
    cdef int64_t* first         # per node: the first element's sequence number
    cdef int64_t* start         # per node: ts of the first element
    cdef int64_t* end           # per node: ts of the last element
    cdef double* agg            # per node, per aggregated column: sum, min, max
    cdef uint8_t* ok            # per node, per aggregated column: every element holds a number
    cdef int32_t* agg_attr      # the store columns aggregated (ATTR_TS / ATTR_ID allowed)
    cdef readonly idx_t n_aggs
    cdef readonly int64_t evicted   # handle of the oldest node kept (handles count every node)
    cdef readonly int64_t offset    # handle of row 0 of the arrays
    cdef readonly idx_t size        # nodes kept
    cdef idx_t cap                  # rows allocated
    cdef readonly idx_t high_water  # most nodes kept at once

    cdef int _reserve(self, idx_t extra) except -1 nogil
    cdef int64_t append(self, EventStore st, int64_t parent, int64_t seq) except -1 nogil
    cdef idx_t evict_end_before(self, ts_t cutoff) noexcept nogil


cdef inline idx_t ls_row(ListStore ls, int64_t handle) noexcept nogil:
    return <idx_t>(handle - ls.offset)
