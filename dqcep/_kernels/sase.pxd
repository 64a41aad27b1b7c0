# The SASE baseline's sequence scan and construction: active instance stacks.
from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t

from dqcep._kernels._table cimport Int64Slot, Int64Table
from dqcep._kernels._types cimport idx_t, ts_t
from dqcep._kernels.operators cimport PredicateSet
from dqcep._kernels.store cimport EventStore


# One active instance stack (or one negated type's event buffer: rip unused).
# Positions are absolute (they only grow), so a pointer into a stack stays valid
# while the bottom is pruned; element p lives at index p - offset.
cdef struct Stack:
    int64_t* seq      # EventStore sequence number of the instance's event
    int64_t* ts       # its ts (stacks are in ts order)
    int64_t* rip      # most recent instance of the previous state's stack at push time
    int64_t offset    # absolute position of element 0 of the buffers
    int64_t lo        # absolute position of the oldest live instance
    int64_t hi        # one past the newest
    int64_t cap       # elements allocated


cdef class SaseNFA:
    cdef readonly idx_t n                 # positive states (SEQ items), n >= 1
    cdef readonly idx_t m                 # negated event types
    cdef readonly int64_t window          # W, ms
    cdef int32_t[::1] state_type          # engine type code per state
    cdef int32_t[::1] neg_type            # per negation
    cdef int8_t[::1] neg_mode             # NEG_GAP / NEG_LEADING / NEG_TRAILING
    cdef int64_t[::1] neg_after           # GAP: the state the gap follows
    cdef int32_t[::1] key_attrs           # [attr] columns partitioning the stacks
    cdef PredicateSet scan_preds          # single-variable predicates, at scan
    cdef PredicateSet build_preds         # the others, grouped by `ranges`
    cdef int64_t[::1] ranges              # groups: depth 0..n-1, final, negation 0..m-1
    cdef bint has_trailing

    cdef Stack* stacks                    # partition p, state s: stacks[p * n + s]
    cdef idx_t n_parts
    cdef idx_t parts_cap
    cdef Int64Table part_of               # partition key -> its index in stacks
    cdef Stack* negs                      # per negation: its events, in ts order

    cdef int64_t* held                    # held matches: n seqs per row
    cdef idx_t n_held
    cdef idx_t held_cap
    cdef int64_t* out_ids                 # emitted matches: n user ids per row
    cdef int64_t* out_det                 # detected_at per row
    cdef idx_t n_out
    cdef idx_t out_cap

    cdef int64_t* rec                     # scratch record: n + m slots
    cdef int64_t* tsb                     # scratch: ts of the bound positive slots
    cdef int64_t* pos                     # scratch: construction cursor per depth

    cdef readonly int64_t pushed          # instances pushed onto the stacks
    cdef readonly int64_t pruned          # instances dropped by window pruning
    cdef readonly int64_t constructed     # sequences built (before negation checks)
    cdef readonly int64_t live_peak       # most instances alive at once
    cdef int64_t live

    cdef int _event(self, EventStore st, int64_t seq, int32_t etype) except -1 nogil
    cdef idx_t _partition(self, uint64_t key) except -1 nogil
    cdef int _construct(self, EventStore st, idx_t part, int64_t seq, ts_t end,
                        int64_t rip) except -1 nogil
    cdef int _complete(self, EventStore st) except -1 nogil
    cdef bint _violated(self, EventStore st, idx_t j, ts_t lo, bint lo_open, ts_t hi,
                        bint hi_open) noexcept nogil
    cdef int _emit(self, EventStore st, ts_t detected) except -1 nogil
