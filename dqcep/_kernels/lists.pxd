# Kleene lists: what other kernels take from lists.pyx.
from libc.stdint cimport int8_t, int64_t

from dqcep._kernels._types cimport idx_t
from dqcep._kernels.operators cimport PredicateSet
from dqcep._kernels.store cimport EventStore, ListStore


# The aggregate values predicate p reads, from the lists in its slots (see lists.pyx).
cdef idx_t list_aggs(PredicateSet ps, idx_t p, ListStore ls, const int64_t* list_of_slot,
                     double* aggv, int8_t* aggk) noexcept nogil
cdef bint holds_with_lists(PredicateSet ps, EventStore st, const int64_t* rec,
                           ListStore ls, const int64_t* list_of_slot) noexcept nogil
