# Compiled predicate sets, shared by every operator kernel, and the input checks they share.
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t

from dqcep._kernels._types cimport idx_t
from dqcep._kernels.store cimport EventStore, ListStore

ctypedef unsigned char[::1] uint8_t_view

# ValueError unless start runs from 0 to total without decreasing
cdef check_offsets(const int64_t[::1] start, idx_t total, str name)
# ValueError unless every column is one of the store's
cdef check_columns(EventStore st, const int32_t[::1] columns)

cdef enum:
    MAX_LIST_RECORD = 128  # slots of a record whose predicates read Kleene lists
    MAX_EXTRAS = 16        # v[i-1] / v[1] / v[last] references in one predicate
    MAX_RANGED = 8         # lists one predicate ranges over


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
    # Kleene lists (spec 5.1; dqcep/plan/bytecode.py): per predicate the list slots it
    # ranges over (slot, EACH 0 | PAIRS 1) and its extra slots (PREVIOUS 0 | FIRST 1 |
    # LAST 2, list slot), extra slot j read as slot width + j of the record
    cdef readonly int64_t[::1] rng_start
    cdef int32_t[::1] rng_slot
    cdef int32_t[::1] rng_mode
    cdef readonly int64_t[::1] ext_start
    cdef int32_t[::1] ext_kind
    cdef int32_t[::1] ext_slot
    cdef readonly bint reads_lists   # some predicate ranges, reads a list position or aggregates

    # Predicates first..last-1 whose slots are all bound (>= 0) in rec hold.
    cdef bint holds_range(self, EventStore st, const int64_t* rec, idx_t first,
                          idx_t last) noexcept nogil
    cdef bint holds(self, EventStore st, const int64_t* rec) noexcept nogil
    # The slots predicate p reads are bound (slots >= width and fixed_slot count as bound).
    cdef bint bound(self, idx_t p, const int64_t* rec, idx_t width,
                    int64_t fixed_slot) noexcept nogil
    # The values of predicate p's aggregate instructions, from the list handles per slot.
    cdef idx_t agg_values(self, idx_t p, ListStore ls, const int64_t* list_of_slot,
                          double* aggv, int8_t* aggk) noexcept nogil
    # Predicate p on a record of ``width`` slots where ``is_list`` slots hold list handles;
    # fixed_slot >= 0: that list is given the element fixed_seq, checked for it alone.
    cdef bint holds_one(self, idx_t p, EventStore st, ListStore ls, const int64_t* rec,
                        const uint8_t* is_list, idx_t width, int64_t fixed_slot,
                        int64_t fixed_seq, int64_t fixed_prev,
                        int64_t fixed_first) noexcept nogil
    # Predicates first..last-1 whose slots are bound hold, lists ranged over whole.
    cdef bint holds_lists(self, EventStore st, ListStore ls, const int64_t* rec,
                          const uint8_t* is_list, idx_t width, idx_t first,
                          idx_t last) noexcept nogil
    # Predicates first..last-1 hold once event seq is placed in slot s of rec (spec 5.2
    # "fits"): a plain slot is bound to it; a list slot (``handle``: the list it grows,
    # -1: a new one) is checked for the new element alone. rec is left as it was.
    cdef bint holds_placed(self, EventStore st, ListStore ls, int64_t* rec,
                           const uint8_t* is_list, idx_t width, idx_t s, int64_t handle,
                           int64_t seq, idx_t first, idx_t last) noexcept nogil
    cdef _check_predicate(self, idx_t p)
    # ValueError unless records of ``width`` slots and the store hold what the code reads
    cdef int check_inputs(self, EventStore st, idx_t width) except -1
