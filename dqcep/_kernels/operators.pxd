# Operator processors' shared pieces: compiled predicate sets.
from libc.stdint cimport int8_t, int32_t, int64_t

from dqcep._kernels._types cimport idx_t
from dqcep._kernels.store cimport EventStore


cdef class PredicateSet:
    cdef readonly int32_t[:, ::1] code
    cdef readonly int64_t[::1] pred_start
    cdef readonly int64_t[::1] slots
    cdef readonly int64_t[::1] slot_start
    cdef readonly double[::1] cval
    cdef readonly int8_t[::1] ckind
    cdef readonly idx_t n
    cdef readonly int64_t max_slot   # largest record slot any instruction reads, -1: none
    cdef readonly int32_t max_attr   # largest store column any instruction reads, -1: none

    # Predicates first..last-1 whose slots are all bound (>= 0) in rec hold.
    cdef bint holds_range(self, EventStore st, const int64_t* rec, idx_t first,
                          idx_t last) noexcept nogil
    cdef bint holds(self, EventStore st, const int64_t* rec) noexcept nogil
    cdef _check_predicate(self, idx_t p)
    # ValueError unless records of ``width`` slots and the store hold what the code reads
    cdef int check_inputs(self, EventStore st, idx_t width) except -1
