# The EVENT vertices' router, whose pass JoinPipeline (joins.pyx) calls.
from libc.stdint cimport int32_t, int64_t

from dqcep._kernels._types cimport idx_t
from dqcep._kernels.predicates cimport PredicateSet
from dqcep._kernels.store cimport EventStore


cdef class LeafRouter:
    cdef readonly int32_t[::1] leaf_type
    cdef int64_t[::1] key_start
    cdef int32_t[::1] key_cols
    cdef readonly PredicateSet preds
    cdef int64_t[::1] pred_start
    cdef int64_t[::1] type_start    # the leaves of type t: type_leaf[type_start[t]:..[t + 1]]
    cdef int32_t[::1] type_leaf
    cdef readonly idx_t n_leaves, n_types

    cdef tuple _route_into(self, EventStore st, const int64_t[::1] seqs,
                           const int64_t[::1] ts, const int32_t[::1] types,
                           int64_t* offsets, int64_t* cursor)
