# Events stored once, by arrival sequence number, and the predicate bytecode evaluator.
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint64_t

from dqcep._kernels._types cimport idx_t, ts_t

# Kind of an attribute cell: values are float64, strings as dictionary codes.
cdef enum:
    KIND_MISSING = 0
    KIND_NUM = 1
    KIND_STR = 2
    KIND_BOOL = 3

# Pseudo-attribute indexes of LOAD: the event's own ts and id.
cdef enum:
    ATTR_TS = -1
    ATTR_ID = -2

cdef enum:
    MAX_STACK = 128
    MAX_AGGS = 64    # aggregate instructions in one predicate (lists.holds_with_lists)

# Predicate bytecode opcodes (dqcep/plan/bytecode.py builds its Op enum from
# store.OPCODES, so they are written here only).
cdef enum:
    OP_CONST = 0
    OP_LOAD = 1
    OP_EQUIV = 2
    OP_NEG = 3
    OP_NOT = 4
    OP_ADD = 5
    OP_SUB = 6
    OP_MUL = 7
    OP_DIV = 8
    OP_EQ = 9
    OP_NE = 10
    OP_LT = 11
    OP_LE = 12
    OP_GT = 13
    OP_GE = 14
    OP_AND = 15
    OP_OR = 16
    # aggregates over the Kleene list in slot a (attribute column b; count reads none)
    OP_AGG_COUNT = 17
    OP_AGG_SUM = 18
    OP_AGG_AVG = 19
    OP_AGG_MIN = 20
    OP_AGG_MAX = 21


cdef class EventStore:
    cdef readonly idx_t n_attrs      # attribute columns (those some predicate or key reads)
    cdef int64_t* ts                 # per row
    cdef int64_t* ids                # per row: the user's event id
    cdef int32_t* type_code          # per row: its type code (-1: not given)
    cdef double* val                 # row * n_attrs + a
    cdef int8_t* kind                # row * n_attrs + a
    cdef readonly int64_t base       # sequence number of the oldest stored event
    cdef readonly int64_t next_seq   # sequence number the next event gets
    cdef idx_t cap                   # rows allocated (power of two)
    cdef idx_t mask                  # cap - 1: row of seq is seq & mask
    cdef readonly idx_t high_water   # most events held at once

    cdef int _grow(self, idx_t need) except -1 nogil
    cdef inline idx_t row(self, int64_t seq) noexcept nogil


cdef bint eval_pred(EventStore st, const int32_t* code, idx_t n_ins, const double* cval,
                    const int8_t* ckind, const int64_t* slots) noexcept nogil
# The same with aggregates: the j-th AGG instruction pushes aggv[j] (a number), or
# fails when aggk[j] is KIND_MISSING (the caller computed them from the lists).
cdef bint eval_pred_aggs(EventStore st, const int32_t* code, idx_t n_ins,
                         const double* cval, const int8_t* ckind, const int64_t* slots,
                         const double* aggv, const int8_t* aggk) noexcept nogil
cdef uint64_t cell_hash(int8_t kind, double v) noexcept nogil


# Kleene lists (spec 5.1), stored once as nodes: a list is its last node, which points
# at the list without its last element. Aggregates are kept per node, incrementally.
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


cdef inline bint share_event(ListStore lists, int64_t a, bint a_list, int64_t b,
                             bint b_list) noexcept nogil:
    """Do two bindings (an event, or a list's handle) hold a common event? (An AND's
    pairs, a guard's negated events: joins.pyx, guards.pyx.)"""
    cdef int64_t x, y
    x = a
    while x >= 0:
        y = b
        while y >= 0:
            if (lists.seq[ls_row(lists, x)] if a_list else x) == \
                    (lists.seq[ls_row(lists, y)] if b_list else y):
                return True
            y = lists.parent[ls_row(lists, y)] if b_list else -1
        x = lists.parent[ls_row(lists, x)] if a_list else -1
    return False


cdef inline bint same_cells(EventStore st, const int32_t[::1] cols, int64_t a,
                            int64_t b) noexcept nogil:
    """Do events a and b (sequence numbers) carry every column of ``cols``, with
    equal values ([attr])? a == b: does a carry them all?"""
    cdef idx_t c, ra = st.row(a), rb = st.row(b), na = st.n_attrs
    cdef int8_t ka
    for c in range(cols.shape[0]):
        ka = st.kind[ra * na + cols[c]]
        if ka == KIND_MISSING or ka != st.kind[rb * na + cols[c]] or \
                st.val[ra * na + cols[c]] != st.val[rb * na + cols[c]]:
            return False
    return True
