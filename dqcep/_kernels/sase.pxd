# The SASE baseline: SEQ by active instance stacks (SaseNFA), Kleene closure and
# selection strategies by SASE+'s runs (SaseRunNFA); what both share (SaseAutomaton).
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint64_t

from dqcep._kernels._table cimport Int64Slot, Int64Table
from dqcep._kernels._types cimport idx_t, ts_t
from dqcep._kernels.predicates cimport PredicateSet
from dqcep._kernels.store cimport EventStore, ListStore


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


# The runs of one partition (SASE+'s PAIS): rows of RW_SLOTS + n words.
cdef struct Runs:
    int64_t* rows
    int64_t n         # runs held
    int64_t cap       # rows allocated


cdef class SaseAutomaton:
    cdef readonly idx_t n                 # positive states (SEQ items; a Kleene item is one)
    cdef readonly idx_t m                 # negated event types
    cdef readonly int64_t window          # W, ms
    cdef int32_t[::1] state_type          # engine type code per state
    cdef int32_t[::1] neg_type            # per negation
    cdef int8_t[::1] neg_mode             # NEG_GAP / NEG_LEADING / NEG_TRAILING
    cdef int64_t[::1] neg_after           # GAP: the state the gap follows
    cdef int32_t[::1] key_attrs           # [attr] columns partitioning the stacks / runs
    cdef PredicateSet scan_preds          # single-variable predicates, at scan
    cdef PredicateSet conds               # the others, grouped by `ranges`
    cdef int64_t[::1] ranges              # groups: state 0..n-1, whole match, negation 0..m-1
    cdef bint has_trailing
    cdef readonly ListStore lists         # Kleene states' lists (None: no Kleene state)
    cdef const uint8_t* flags             # per record slot: holds a list (NULL: none does)

    cdef idx_t n_parts
    cdef idx_t parts_cap
    cdef Int64Table part_of               # partition key -> its index
    cdef Stack* negs                      # per negation: its events, in ts order

    cdef int64_t* held                    # held matches: n words per row
    cdef idx_t n_held
    cdef idx_t held_cap
    cdef int64_t* out_rows                # emitted matches: n words per row
    cdef int64_t* out_det                 # detected_at per row
    cdef idx_t n_out
    cdef idx_t out_cap
    cdef int64_t* rec                     # scratch record: n + m slots, then scratch

    cdef readonly int64_t pruned          # instances / runs dropped by the window
    cdef readonly int64_t live_peak       # most alive at once
    cdef int64_t live

    cdef _setup(self, int64_t window, state_types, neg_types, neg_modes, neg_after,
                key_attrs, PredicateSet scan_preds, PredicateSet conds, ranges,
                idx_t scratch)
    cdef int _resize_parts(self, idx_t cap) except -1 nogil
    cdef idx_t _partition(self, uint64_t key) except -1 nogil
    cdef bint _key(self, EventStore st, idx_t r, uint64_t* key) noexcept nogil
    cdef int _buffer_negated(self, EventStore st, int64_t seq, ts_t ts,
                             int32_t etype) except -1 nogil
    cdef ts_t _start_of(self, EventStore st, idx_t s, int64_t v) noexcept nogil
    cdef ts_t _end_of(self, EventStore st, idx_t s, int64_t v) noexcept nogil
    cdef bint _violated(self, EventStore st, idx_t j, ts_t lo, bint lo_open, ts_t hi,
                        bint hi_open) noexcept nogil
    cdef int _finish(self, EventStore st) except -1 nogil
    cdef int _emit(self, const int64_t* slots, ts_t detected) except -1 nogil
    cdef void _born(self) noexcept nogil
    cdef int64_t _shared_nbytes(self)


cdef class SaseNFA(SaseAutomaton):
    cdef Stack* stacks                    # partition p, state s: stacks[p * n + s]
    cdef int64_t* tsb                     # scratch: ts of the bound positive slots
    cdef int64_t* pos                     # scratch: construction cursor per depth
    cdef readonly int64_t pushed          # instances pushed onto the stacks
    cdef readonly int64_t constructed     # sequences built (before negation checks)

    cdef int _event(self, EventStore st, int64_t seq, int32_t etype) except -1 nogil
    cdef int _construct(self, EventStore st, idx_t part, int64_t seq, ts_t end,
                        int64_t rip) except -1 nogil
    cdef int _complete(self, EventStore st) except -1 nogil


cdef class SaseRunNFA(SaseAutomaton):
    cdef readonly int strategy            # STRATEGIES
    cdef idx_t width                      # words of a run row
    cdef uint8_t[::1] is_list             # per record slot (n states, m negations)
    cdef Runs* parts                      # per partition
    cdef readonly int64_t started         # runs begun
    cdef readonly int64_t forked          # runs cloned (a non-deterministic edge)

    cdef int _event(self, EventStore st, int64_t seq, int32_t etype) except -1 nogil
    cdef int _clone(self, EventStore st, Runs* R, idx_t i, idx_t s, int64_t seq,
                    int64_t ts) except -1 nogil
    cdef int _take(self, EventStore st, int64_t* row, idx_t s, int64_t seq,
                   int64_t ts) except -1 nogil
    cdef bint _fits(self, EventStore st, const int64_t* row, idx_t s, int64_t seq,
                    int64_t ts, int32_t etype) noexcept nogil
    cdef int _complete(self, EventStore st, const int64_t* row) except -1 nogil
