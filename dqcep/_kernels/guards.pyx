"""NOT guards: no match of the negated pattern inside the interval a host record's
mode defines (spec section 3's negation, compiled per NOT vertex).

``Guard.keep`` masks host records (an OUTPUT's, held ones); ``Guard.drop_violated``
drops them in place from a join's ring. The negated store (its matches in end-ts
order) is engine state, passed in.
"""
from libc.stdint cimport INT64_MAX, INT64_MIN, int8_t, int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport free

import numpy as np

from dqcep._kernels._types cimport idx_t, ts_t
from dqcep._kernels._alloc cimport grow
from dqcep._kernels.predicates cimport MAX_LIST_RECORD, PredicateSet, uint8_t_view
from dqcep._kernels.ring cimport (COL_END, COL_IDS, COL_KEY, COL_START, RingBuffer,
                                  first_end_after, ring_row)
from dqcep._kernels.store cimport EventStore, ListStore, ls_row, share_event

cdef enum:
    GUARD_GAP = 0
    GUARD_LEADING = 1
    GUARD_TRAILING = 2
    GUARD_AND = 3

# The planner's guard modes (``GuardSpec.mode``) as the kernel codes them: defined
# here, once, and imported by the runtime's compiler.
GUARD_MODES = {"GAP": GUARD_GAP, "LEADING": GUARD_LEADING, "TRAILING": GUARD_TRAILING,
               "AND": GUARD_AND}



cdef class Guard:
    """Guard(mode, n_host, left_slots, right_slots, active_slots, preds, window,
             host_lists=(), n_negated=0)

    A NOT, compiled: no record of the negated store (the negated pattern's
    matches, in end-ts order; engine state, passed to ``keep``) may lie inside
    the interval the mode defines for a host record.
    """
    cdef readonly int mode
    cdef readonly idx_t n_host
    cdef readonly int64_t[::1] left_slots, right_slots, active_slots
    cdef readonly PredicateSet preds
    cdef readonly int64_t window
    cdef readonly uint8_t[::1] host_lists   # per host slot: it holds a Kleene list
    cdef readonly bint has_lists

    def __init__(self, int mode, idx_t n_host, left_slots, right_slots, active_slots,
                 PredicateSet preds, int64_t window, host_lists=(), idx_t n_negated=0):
        if mode < GUARD_GAP or mode > GUARD_AND:
            raise ValueError(f"guard mode {mode} is not one of 0..3")
        self.mode, self.n_host, self.window = mode, n_host, window
        self.left_slots = np.ascontiguousarray(left_slots, dtype=np.int64)
        self.right_slots = np.ascontiguousarray(right_slots, dtype=np.int64)
        self.active_slots = np.ascontiguousarray(active_slots, dtype=np.int64)
        self.preds = preds
        mask = np.zeros(n_host + n_negated + 1, dtype=np.uint8)  # host, then negated slots
        mask[list(host_lists)] = 1
        self.host_lists = mask
        self.has_lists = bool(mask.any())

    cdef inline ts_t _end_of(self, EventStore st, ListStore lists, idx_t slot,
                             int64_t s) noexcept nogil:
        """When host slot ``slot`` (an event, or a list) ends: its last event's ts."""
        if self.host_lists[slot]:
            return lists.end[ls_row(lists, s)]
        return st.ts[s & st.mask]

    cdef inline ts_t _start_of(self, EventStore st, ListStore lists, idx_t slot,
                               int64_t s) noexcept nogil:
        """When host slot ``slot`` (an event, or a list) starts: its first event's ts."""
        if self.host_lists[slot]:
            return lists.start[ls_row(lists, s)]
        return st.ts[s & st.mask]

    cdef bint violated(self, EventStore st, ListStore lists, RingBuffer negated,
                       const int64_t* host, ts_t start, ts_t end,
                       int64_t* scratch) noexcept nogil:
        cdef idx_t i, j, k, nc = negated.n_ids
        cdef bint active = False, lo_open, hi_open, shared
        cdef ts_t lo = 0, hi = 0, t
        cdef int64_t* r
        cdef int64_t s
        for i in range(self.active_slots.shape[0]):
            if host[self.active_slots[i]] >= 0:
                active = True
                break
        if not active:
            return False
        if self.mode == GUARD_GAP or self.mode == GUARD_TRAILING:
            lo, lo_open = -(1 << 62), True
            for i in range(self.left_slots.shape[0]):
                s = host[self.left_slots[i]]
                if s >= 0:
                    t = self._end_of(st, lists, self.left_slots[i], s)
                    if t > lo:
                        lo = t
        else:
            lo, lo_open = end - self.window, False
        if self.mode == GUARD_GAP or self.mode == GUARD_LEADING:
            hi, hi_open = 1 << 62, True
            for i in range(self.right_slots.shape[0]):
                s = host[self.right_slots[i]]
                if s >= 0:
                    t = self._start_of(st, lists, self.right_slots[i], s)
                    if t < hi:
                        hi = t
        else:
            hi, hi_open = start + self.window, False
        i = first_end_after(negated, lo, not lo_open)
        while i < negated.size:
            r = negated.row(i)
            if r[COL_END] > hi or (hi_open and r[COL_END] == hi):
                break
            i += 1
            if r[COL_START] < lo or (lo_open and r[COL_START] == lo):
                continue
            shared = False  # the negated event is never one of the match's own
            for j in range(nc):
                for k in range(self.n_host):
                    if r[COL_IDS + j] < 0 or host[k] < 0:
                        continue
                    if self.host_lists[k]:
                        if share_event(lists, host[k], True, r[COL_IDS + j], False):
                            shared = True
                    elif r[COL_IDS + j] == host[k]:
                        shared = True
            if shared:
                continue
            for k in range(self.n_host):
                scratch[k] = host[k]
            for j in range(nc):
                scratch[self.n_host + j] = r[COL_IDS + j]
            if self.has_lists:  # it blocks when the conditions hold for every element
                if self.preds.holds_lists(st, lists, scratch, &self.host_lists[0],
                                          self.n_host + nc, 0, self.preds.n):
                    return True
            elif self.preds.holds(st, scratch):
                return True
        return False

    cdef _check_keep(self, EventStore st, RingBuffer negated, idx_t width, ListStore lists):
        """ValueError unless host records of ``width`` slots, the negated store and
        the store hold what the guard reads."""
        if width < self.n_host:
            raise ValueError(f"host records have {width} slots, the guard reads "
                             f"{self.n_host}")
        if self.has_lists:
            if lists is None:
                raise ValueError("a guard over Kleene lists needs the engine's ListStore")
            if self.host_lists.shape[0] <= self.n_host + negated.n_ids or \
                    self.n_host + negated.n_ids > MAX_LIST_RECORD:
                raise ValueError(f"the guard was built for {self.host_lists.shape[0] - 1} "
                                 f"slots (at most {MAX_LIST_RECORD}), the negated store has "
                                 f"{negated.n_ids} after {self.n_host}")
            self.preds.check_lists_inputs(st, self.n_host + negated.n_ids)
        else:
            self.preds.check_inputs(st, self.n_host + negated.n_ids)

    cdef int64_t* _scratch(self, RingBuffer negated) except NULL:
        """A record of the host's slots and a negated record's, for ``violated``
        (the caller frees it)."""
        return <int64_t*>grow(NULL, (self.n_host + negated.n_ids + 1) * sizeof(int64_t))

    def keep(self, EventStore st, RingBuffer negated, const int64_t[::1] starts,
             const int64_t[::1] ends, const int64_t[:, ::1] recs, ListStore lists=None):
        """Mask of the host records this NOT does not forbid, given the negated store
        (and the engine's ListStore where host slots hold Kleene lists)."""
        self._check_keep(st, negated, recs.shape[1] if recs.shape[0] else self.n_host, lists)
        n = recs.shape[0]
        out = np.ones(n, dtype=bool)
        cdef uint8_t_view o = out.view(np.uint8)
        cdef idx_t i
        cdef int64_t* scratch = self._scratch(negated)
        try:
            with nogil:
                for i in range(n):
                    o[i] = not self.violated(st, lists, negated, &recs[i, 0], starts[i],
                                             ends[i], scratch)
        finally:
            free(scratch)
        return out

    def drop_violated(self, EventStore st, RingBuffer negated, RingBuffer recs,
                      ListStore lists=None):
        """``keep`` on the records of a ring, in place: the records this NOT forbids
        are dropped, the others keep their order. Returns how many were dropped. (A
        join's output is checked where it was made, before any of it is copied.)"""
        cdef idx_t i, w = 0, j, n = recs.size
        cdef int64_t* r
        cdef int64_t* into
        self._check_keep(st, negated, recs.n_ids, lists)
        if n == 0:
            return 0
        cdef int64_t* scratch = self._scratch(negated)
        try:
            with nogil:
                for i in range(n):
                    r = ring_row(recs, i)
                    if self.violated(st, lists, negated, r + COL_IDS, r[COL_START],
                                     r[COL_END], scratch):
                        continue
                    if w != i:
                        into = ring_row(recs, w)
                        for j in range(recs.width):
                            into[j] = r[j]
                    w += 1
                recs.size = w
        finally:
            free(scratch)
        return n - w
