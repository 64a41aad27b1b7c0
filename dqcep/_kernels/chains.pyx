"""A flat SEQ under skip-till-any-match built when its last event comes (issue 40).

SASE's construction (Wu, Diao, Rizzi, SIGMOD 2006) carried to Kleene items: the
operator keeps, per [attr] partition and per slot, the events that may fill the
slot (its type, its own conditions: a *stack*, in ts order, pruned by the
window), and builds no partial match until an event comes that fits the last slot.
Then it binds the slots in an order that lets every condition prune as early as it
can:

1. the plain (non-Kleene) slots from the last to the first, each from its stack:
   an event before the one bound to its right and inside the window of the last
   event; a condition is checked as soon as its plain slots are bound;
2. the Kleene slots from the first to the last, each a list of its stack's events
   strictly between its neighbours: the events that pass its conditions against
   what is bound (``b.price > a.price``) are found once, then every non-empty
   sub-list of them with strictly increasing ts is made element by element, its
   iteration conditions (``b[i].x > b[i-1].x``, ``b[1]``) checked as each element is
   appended, so a list that fails is never extended; a trailing Kleene slot's list
   ends with the last event;
3. the whole-list conditions (aggregates, ``v[last]``) and nested [attr]s on the
   complete match.

Its result is the skip-till-any-match set of spec 5.1 (every combination, each
once), so it returns what the DAG of joins returns; its cost is the matches made
and the bindings tried, not every partial match of the window (which the DAG keeps
and, for a Kleene item, 2^n lists of it whatever the neighbours' conditions).

The caller hands events in ts order, once no event of a smaller ts can still come
(an event's enumeration reads the events of smaller ts only; two of equal ts are
never paired, so their order does not matter). Matches
are rows like a run operator's (``dqcep._kernels.runs``): per slot an event's
sequence number or a list handle of the engine's ListStore.
"""
cimport cython
from cython.view cimport array as cvarray
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memmove, memset

import numpy as np

from dqcep._kernels.ring import StateBudgetExceeded

from dqcep._kernels._alloc cimport grow
from dqcep._kernels._table cimport (Int64Table, table_free, table_get, table_init,
                                    table_set)
from dqcep._kernels._types cimport idx_t
from dqcep._kernels.predicates cimport PredicateSet
from dqcep._kernels.ring cimport (COL_END, COL_IDS, COL_KEY, COL_START, RingBuffer, ring_push,
                                   ring_row)
from dqcep._kernels.store cimport EventStore, ListStore, ls_row, same_cells

cdef enum:
    MAX_CHAIN_SLOTS = 32
    MIN_STACK = 16
    KEEP_STACK = 64   # an emptied stack up to this capacity keeps its arrays
    MEMO_ENTRIES = 64   # bindings whose lists one call keeps (direct-mapped by binding)
    # the condition groups of slot s (``group_first``): 3 s its filter (the event
    # alone, checked before it is stacked), 3 s + 1 checked when it is bound (for a
    # Kleene slot: per element, against what is bound), 3 s + 2 a Kleene slot's
    # iteration conditions (per element, against the list before it); 3 k the
    # whole-match ones
    G_FILTER = 0
    G_BIND = 1
    G_ITER = 2


# the most slots a chain has, for the planner that decides what may run as one
# (dqcep.plan.decompose): declared here, once
CHAIN_SLOTS = MAX_CHAIN_SLOTS


cdef struct Memo:
    # The lists of the memo slot for one binding of the slots before it (``ctx``),
    # made from its candidates with ts below ``hi``, grouped by the candidate each
    # ends with: a later last event with the same binding extends them and reads
    # the prefix below its own bound instead of making them again.
    int64_t ctx[MAX_CHAIN_SLOTS]
    int64_t key_seq       # an event with the [attr] values they were made for
    int64_t hi
    bint live
    idx_t m               # candidates
    idx_t cand_cap
    int64_t* cand
    int64_t* cand_ts
    idx_t* node_start     # candidate j's first node; node_start[m] = n_nodes
    idx_t n_nodes
    idx_t node_cap
    int64_t* node         # list handles
    idx_t* node_last      # the candidate each ends with


cdef struct Stack:
    int64_t* seq
    int64_t* ts
    int64_t* rip    # per entry: the left plain neighbour's entries before it end here
                    # (SASE's pointer: an absolute position there), -1: no such slot
    idx_t lo        # first live entry
    idx_t hi        # one past the last
    idx_t cap
    int64_t dropped  # absolute position of array row 0 (rows moved out or freed)


cdef class ChainSpec:
    """The operator, compiled (never changed): the slots' types and kinds, the
    conditions in groups (see ``G_*``; ``group_first`` has 3 k + 2 bounds), the
    window and the [attr] store columns."""
    cdef readonly int64_t window
    cdef readonly idx_t k
    cdef int32_t[::1] slot_type
    cdef uint8_t[::1] slot_kleene
    cdef readonly PredicateSet conds
    cdef int64_t[::1] group_first
    cdef int32_t[::1] key_cols

    def __init__(self, int64_t window, slot_type, slot_kleene, PredicateSet conds,
                 group_first, key_cols):
        cdef idx_t j
        self.window = window
        self.slot_type = np.ascontiguousarray(slot_type, dtype=np.int32)
        self.slot_kleene = np.ascontiguousarray(slot_kleene, dtype=np.uint8)
        self.k = self.slot_type.shape[0]
        self.conds = conds
        self.group_first = np.ascontiguousarray(group_first, dtype=np.int64)
        self.key_cols = np.ascontiguousarray(key_cols, dtype=np.int32)
        if not 1 <= self.k <= MAX_CHAIN_SLOTS or self.slot_kleene.shape[0] != self.k:
            raise ValueError(f"a chain has 1..{MAX_CHAIN_SLOTS} slots, one kind per slot")
        if self.group_first.shape[0] != 3 * self.k + 2 or self.group_first[0] != 0 \
                or self.group_first[3 * self.k + 1] != conds.n:
            raise ValueError("group_first must bound every condition, in 3 k + 1 groups")
        for j in range(3 * self.k + 1):
            if self.group_first[j] > self.group_first[j + 1]:
                raise ValueError("group_first must not decrease")
        conds.check_list_slots(self.slot_kleene)


cdef class ChainStacks:
    """The operator's state: per partition key, a stack per slot."""
    cdef readonly idx_t k
    cdef Stack* stacks        # partition p, slot s: stacks[p * k + s]
    cdef int64_t* part_key    # per partition: its key
    cdef idx_t n_parts
    cdef idx_t parts_cap
    cdef Int64Table part_of   # key -> partition
    cdef readonly idx_t live
    cdef readonly idx_t high_water
    cdef uint8_t left_plain[MAX_CHAIN_SLOTS]  # a plain slot after a plain slot: its
                                              # entries point into that slot's stack

    def __cinit__(self, idx_t k, kleene=None):
        cdef idx_t s
        if not 1 <= k <= MAX_CHAIN_SLOTS:
            raise ValueError(f"a chain has 1..{MAX_CHAIN_SLOTS} slots")
        flags = [False] * k if kleene is None else [bool(x) for x in kleene]
        if len(flags) != k:
            raise ValueError("one kind per slot")
        for s in range(k):
            self.left_plain[s] = s > 0 and not flags[s] and not flags[s - 1]
        self.k = k
        self.stacks = NULL
        self.part_key = NULL
        self.n_parts = self.parts_cap = 0
        self.live = self.high_water = 0
        table_init(&self.part_of, 16)

    def __dealloc__(self):
        cdef idx_t i
        for i in range(self.n_parts * self.k):
            free(self.stacks[i].seq)
            free(self.stacks[i].ts)
            free(self.stacks[i].rip)
        free(self.stacks)
        free(self.part_key)
        table_free(&self.part_of)

    cdef idx_t _partition(self, int64_t key) except -1 nogil:
        cdef int64_t p = table_get(&self.part_of, key)
        cdef idx_t i, cap
        if p >= 0:
            return <idx_t>p
        if self.n_parts == self.parts_cap:
            cap = self.parts_cap * 2 if self.parts_cap else 4
            self.stacks = <Stack*>grow(self.stacks, cap * self.k * sizeof(Stack))
            self.part_key = <int64_t*>grow(self.part_key, cap * sizeof(int64_t))
            for i in range(self.parts_cap * self.k, cap * self.k):
                self.stacks[i] = Stack(NULL, NULL, NULL, 0, 0, 0, 0)
            self.parts_cap = cap
        p = self.n_parts
        self.part_key[p] = key
        self.n_parts += 1
        table_set(&self.part_of, key, p)
        return <idx_t>p

    cdef int _push(self, Stack* s, int64_t seq, int64_t ts, int64_t rip) except -1 nogil:
        cdef idx_t live = s.hi - s.lo, cap
        if s.hi == s.cap:
            if s.lo:                             # drop the pruned bottom first
                memmove(s.seq, s.seq + s.lo, live * sizeof(int64_t))
                memmove(s.ts, s.ts + s.lo, live * sizeof(int64_t))
                memmove(s.rip, s.rip + s.lo, live * sizeof(int64_t))
                s.dropped += s.lo
                s.lo, s.hi = 0, live
            if live * 2 > s.cap or not s.cap:    # still more than half full: grow
                cap = s.cap * 2 if s.cap else MIN_STACK
                s.seq = <int64_t*>grow(s.seq, cap * sizeof(int64_t))
                s.ts = <int64_t*>grow(s.ts, cap * sizeof(int64_t))
                s.rip = <int64_t*>grow(s.rip, cap * sizeof(int64_t))
                s.cap = cap
        s.seq[s.hi] = seq
        s.ts[s.hi] = ts
        s.rip[s.hi] = rip
        s.hi += 1
        self.live += 1
        if self.live > self.high_water:
            self.high_water = self.live
        return 0

    cdef void _prune(self, Stack* s, int64_t cutoff) noexcept nogil:
        """Drop the entries with ts < cutoff. An emptied stack starts again at its
        bottom; it is freed only when it had grown past KEEP_STACK entries (freed at
        every emptying, the stacks of many keys with few events a window each were
        allocated and freed again for nearly every event: a fifth of the time)."""
        while s.lo < s.hi and s.ts[s.lo] < cutoff:
            s.lo += 1
            self.live -= 1
        if s.lo == s.hi and s.hi:
            s.dropped += s.hi
            s.lo = s.hi = 0
            if s.cap > KEEP_STACK:
                free(s.seq)
                free(s.ts)
                free(s.rip)
                s.seq = s.ts = s.rip = NULL
                s.cap = 0

    @property
    def nbytes(self) -> int:
        """Bytes held: the stacks and the partition table."""
        cdef idx_t i
        cdef int64_t total = (self.part_of.mask + 1) * 16 + self.parts_cap * (
            self.k * sizeof(Stack) + 8)
        for i in range(self.n_parts * self.k):
            total += self.stacks[i].cap * 16
        return total

    def evict_start_before(self, int64_t cutoff) -> int:
        """Drop every stacked event with ts < cutoff (no match with it can still be
        made); returns how many."""
        cdef idx_t i, before = self.live
        for i in range(self.n_parts * self.k):
            self._prune(&self.stacks[i], cutoff)
        return before - self.live

    def dump(self) -> np.ndarray:
        """Every stacked event as a row (key, slot, seq, ts), in stack order."""
        out = np.empty((self.live, 4), dtype=np.int64)
        cdef int64_t[:, ::1] o = out
        cdef idx_t p, s, j, n = 0
        cdef Stack* st
        for p in range(self.n_parts):
            for s in range(self.k):
                st = &self.stacks[p * self.k + s]
                for j in range(st.lo, st.hi):
                    o[n, 0], o[n, 1], o[n, 2], o[n, 3] = self.part_key[p], s, st.seq[j], st.ts[j]
                    n += 1
        return out

    def load(self, const int64_t[:, ::1] rows) -> None:
        """Stack the rows ``dump`` gave (into an empty state)."""
        cdef idx_t i, j
        if rows.shape[0] and rows.shape[1] != 4:
            raise ValueError("stacked events are rows of (key, slot, seq, ts)")
        cdef Stack* part
        for i in range(rows.shape[0]):
            if not 0 <= rows[i, 1] < self.k:
                raise ValueError(f"a stacked event of slot {rows[i, 1]} in a chain of "
                                 f"{self.k} slots")
            part = &self.stacks[self._partition(rows[i, 0]) * self.k]
            self._push(&part[rows[i, 1]], rows[i, 2], rows[i, 3], -1)
        for i in range(self.n_parts * self.k):   # the pointers, once every stack is in
            if self.left_plain[i % self.k]:
                part = &self.stacks[(i // self.k) * self.k + i % self.k - 1]
                for j in range(self.stacks[i].lo, self.stacks[i].hi):
                    self.stacks[i].rip[j] = part.dropped + _below(part, self.stacks[i].ts[j])


cdef inline idx_t _below(Stack* s, int64_t t) noexcept nogil:
    """One past the last entry with ts < t."""
    cdef idx_t lo = s.lo, hi = s.hi, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if s.ts[mid] < t:
            lo = mid + 1
        else:
            hi = mid
    return lo


@cython.final
cdef class _Build:
    """One event's enumeration: what every step reads (scratch, reused per event)."""
    cdef ChainSpec sp
    cdef PredicateSet ps
    cdef EventStore st
    cdef ListStore ls
    cdef RingBuffer out
    cdef Stack* part            # the partition's k stacks
    cdef int64_t rec[MAX_CHAIN_SLOTS]
    cdef int64_t rec_ts[MAX_CHAIN_SLOTS]   # a plain slot's event ts (read, not looked up)
    cdef int64_t rec_rip[MAX_CHAIN_SLOTS]  # a plain slot's event's pointer (-1: none)
    cdef ChainStacks stacks
    cdef int32_t right_plain[MAX_CHAIN_SLOTS]  # the nearest plain slot to the right, -1
    cdef const int64_t* gf                  # group_first
    cdef const uint8_t* is_list
    cdef int32_t plain[MAX_CHAIN_SLOTS]    # plain slots, last first
    cdef int32_t lists[MAX_CHAIN_SLOTS]    # Kleene slots, first first
    cdef idx_t n_plain, n_lists
    cdef int64_t last_seq, last_ts, key, floor   # floor: the window's earliest ts
    cdef int64_t made
    # per Kleene slot: the events that pass its bind conditions, and the DFS arrays
    cdef int64_t* cand[MAX_CHAIN_SLOTS]
    cdef int64_t* cand_ts[MAX_CHAIN_SLOTS]
    cdef int64_t* path_pos[MAX_CHAIN_SLOTS]
    cdef int64_t* path_handle[MAX_CHAIN_SLOTS]
    cdef idx_t cand_cap[MAX_CHAIN_SLOTS]
    # the Kleene slot whose lists are kept per binding of the slots before it (-1:
    # none): one whose conditions read no slot after it (``_memo_slot``)
    cdef idx_t memo_slot
    cdef Memo* memo           # MEMO_ENTRIES of them, made at the memo slot's first use
    # matches written as a query's output (``chain_step_ids``): detected, user ids of
    # the slots ``var_slots`` names; at most ``limit`` of them (0: no limit)
    cdef bint direct
    cdef const int64_t* var_slots
    cdef idx_t n_vars, n_out, cap_out, limit
    cdef int64_t* det_buf
    cdef int64_t* ids_buf

    def __cinit__(self):
        cdef idx_t i
        for i in range(MAX_CHAIN_SLOTS):
            self.cand[i] = self.cand_ts[i] = self.path_pos[i] = self.path_handle[i] = NULL
            self.cand_cap[i] = 0
        self.direct = False
        self.det_buf = self.ids_buf = NULL
        self.n_out = self.cap_out = self.limit = self.n_vars = 0
        self.memo_slot = -1
        self.memo = NULL

    def __dealloc__(self):
        cdef idx_t i
        for i in range(MAX_CHAIN_SLOTS):
            free(self.cand[i])
            free(self.cand_ts[i])
            free(self.path_pos[i])
            free(self.path_handle[i])
        if self.memo != NULL:
            for i in range(MEMO_ENTRIES):
                free(self.memo[i].cand)
                free(self.memo[i].cand_ts)
                free(self.memo[i].node_start)
                free(self.memo[i].node)
                free(self.memo[i].node_last)
            free(self.memo)
        free(self.det_buf)
        free(self.ids_buf)

    cdef int _grow_out(self) except -1 nogil:
        cdef idx_t cap = self.cap_out * 2 if self.cap_out else 1024
        self.det_buf = <int64_t*>grow(self.det_buf, cap * sizeof(int64_t))
        self.ids_buf = <int64_t*>grow(self.ids_buf, cap * max(self.n_vars, 1) * sizeof(int64_t))
        self.cap_out = cap
        return 0

    cdef int _reserve(self, idx_t j, idx_t n) except -1 nogil:
        cdef idx_t cap = self.cand_cap[j] if self.cand_cap[j] else MIN_STACK
        if n <= self.cand_cap[j]:
            return 0
        while cap < n:
            cap *= 2
        self.cand[j] = <int64_t*>grow(self.cand[j], cap * sizeof(int64_t))
        self.cand_ts[j] = <int64_t*>grow(self.cand_ts[j], cap * sizeof(int64_t))
        self.path_pos[j] = <int64_t*>grow(self.path_pos[j], (cap + 1) * sizeof(int64_t))
        self.path_handle[j] = <int64_t*>grow(self.path_handle[j], (cap + 1) * sizeof(int64_t))
        self.cand_cap[j] = cap
        return 0

    cdef inline bint _holds(self, idx_t s, idx_t group) noexcept nogil:
        """Slot s's group, on the record as bound (s a plain slot)."""
        cdef idx_t first = <idx_t>self.gf[3 * s + group], last = <idx_t>self.gf[3 * s + group + 1]
        if first == last:
            return True
        if not self.ps.reads_lists:   # plain conditions: the interpreter straight away
            return self.ps.holds_range(self.st, self.rec, first, last)
        return self.ps.holds_lists(self.st, self.ls, self.rec, self.is_list, self.sp.k,
                                   first, last)

    cdef inline bint _holds_element(self, idx_t s, idx_t group, int64_t handle,
                                    int64_t seq) noexcept nogil:
        """Slot s's group with event seq appended to list ``handle`` (-1: none)."""
        cdef idx_t first = <idx_t>self.gf[3 * s + group], last = <idx_t>self.gf[3 * s + group + 1]
        return first == last or self.ps.holds_placed(self.st, self.ls, self.rec, self.is_list,
                                                     self.sp.k, s, handle, seq, first, last)

    cdef inline int64_t _right_ts(self, idx_t s) noexcept nogil:
        """The ts a slot's events must lie before: the nearest plain slot's to the
        right, or the last event's (a trailing list ends with it)."""
        return self.last_ts if self.right_plain[s] < 0 else self.rec_ts[self.right_plain[s]]

    cdef int64_t _left_ts(self, idx_t s) noexcept nogil:
        """The ts a Kleene slot's elements must lie after (its left neighbour is bound)."""
        cdef int64_t h
        if s == 0:
            return self.floor - 1
        h = self.rec[s - 1]
        if self.is_list[s - 1]:
            return self.ls.end[ls_row(self.ls, h)]
        return self.rec_ts[s - 1]

    cdef int plain_step(self, idx_t i) except -1 nogil:
        """Bind plain slot ``plain[i]`` (and then the rest)."""
        cdef idx_t s, j
        cdef int32_t r
        cdef Stack* stack
        cdef int64_t seq
        cdef bint closes
        if i == self.n_plain:
            return self.list_step(0)
        # the last plain slot of a chain without lists: each event bound is a match
        closes = i + 1 == self.n_plain and self.n_lists == 0
        s = self.plain[i]
        if s == self.sp.k - 1:     # the last event (on no stack: no pointer)
            self.rec[s], self.rec_ts[s], self.rec_rip[s] = self.last_seq, self.last_ts, -1
            if self._holds(s, G_BIND):
                self.plain_step(i + 1)
            self.rec[s] = -1
            return 0
        stack = &self.part[s]
        r = self.right_plain[s]
        if r == s + 1 and self.rec_rip[r] >= 0:   # the anchor's pointer: no search
            j = <idx_t>min(max(self.rec_rip[r] - stack.dropped, <int64_t>stack.lo),
                           <int64_t>stack.hi)
        else:
            j = _below(stack, self._right_ts(s))
        while j > stack.lo:
            j -= 1
            if stack.ts[j] < self.floor:
                break
            seq = stack.seq[j]
            if self.sp.key_cols.shape[0] and not same_cells(self.st, self.sp.key_cols,
                                                            seq, self.last_seq):
                continue
            self.rec[s], self.rec_ts[s], self.rec_rip[s] = seq, stack.ts[j], stack.rip[j]
            if self._holds(s, G_BIND):
                if closes:
                    self.finish()
                else:
                    self.plain_step(i + 1)
        self.rec[s] = -1
        return 0

    cdef int list_step(self, idx_t i) except -1 nogil:
        """Make every list of Kleene slot ``lists[i]`` (and then the rest)."""
        cdef idx_t s, j, m = 0, d, n, start
        cdef Stack* stack
        cdef int64_t lo, hi, seq, handle, parent, last_ts
        cdef bint trailing
        if i == self.n_lists:
            return self.finish()
        s = self.lists[i]
        if s == self.memo_slot:
            return self.memo_step(i)
        trailing = s == self.sp.k - 1
        lo, hi = self._left_ts(s), self._right_ts(s)
        if trailing and not self._holds_element(s, G_BIND, -1, self.last_seq):
            return 0                        # the last event cannot end the list
        # the events between the neighbours that pass the conditions against them
        stack = &self.part[s]
        n = _below(stack, hi)
        start = _below(stack, lo + 1)
        self._reserve(s, n - start + 1)
        for j in range(start, n):
            seq = stack.seq[j]
            if self.sp.key_cols.shape[0] and not same_cells(self.st, self.sp.key_cols,
                                                            seq, self.last_seq):
                continue
            if self._holds_element(s, G_BIND, -1, seq):
                self.cand[s][m] = seq
                self.cand_ts[s][m] = stack.ts[j]
                m += 1
        # depth first over the sub-lists in ts order: path_pos[d] is the candidate
        # at depth d, path_handle[d] the list up to it
        d, j, parent, last_ts = 0, 0, -1, lo
        if trailing:
            self._close(i, s, parent)
        while True:
            if j < m:
                if self.cand_ts[s][j] > last_ts and \
                        self._holds_element(s, G_ITER, parent, self.cand[s][j]):
                    handle = self.ls.append(self.st, parent, self.cand[s][j])
                    self.path_pos[s][d], self.path_handle[s][d] = j, handle
                    d += 1
                    parent, last_ts = handle, self.cand_ts[s][j]
                    if trailing:
                        self._close(i, s, parent)
                    else:
                        self.rec[s] = parent
                        self.list_step(i + 1)
                        self.rec[s] = -1
                j += 1
                continue
            if d == 0:
                break
            d -= 1
            j = self.path_pos[s][d] + 1
            if d:
                parent = self.path_handle[s][d - 1]
                last_ts = self.cand_ts[s][self.path_pos[s][d - 1]]
            else:
                parent, last_ts = -1, lo
        return 0

    cdef int memo_step(self, idx_t i) except -1 nogil:
        """``list_step`` of the memo slot: its lists for the binding before it, kept
        from an earlier last event with that binding and extended to this one's bound
        (the same lists the depth-first walk makes: every ts-increasing sub-list of the
        candidates whose elements pass the iteration conditions one by one)."""
        cdef idx_t s = self.lists[i], n, q
        cdef int64_t hi = self._right_ts(s)
        cdef Memo* e = self._memo_for(s)
        if hi > e.hi:
            self._memo_extend(e, s, hi)
        n = e.m
        while n > 0 and e.cand_ts[n - 1] >= hi:
            n -= 1
        if n == 0:
            return 0
        for q in range(e.node_start[n]):
            self.rec[s] = e.node[q]
            self.list_step(i + 1)
        self.rec[s] = -1
        return 0

    cdef Memo* _memo_for(self, idx_t s) except NULL nogil:
        """The memo entry of the binding of the slots before s (a fresh one in its
        place when another binding held it)."""
        cdef uint64_t h = 0
        cdef idx_t t
        cdef Memo* e
        if self.memo == NULL:   # zeroed: no entry live, no array yet
            self.memo = <Memo*>grow(NULL, MEMO_ENTRIES * sizeof(Memo))
            memset(self.memo, 0, MEMO_ENTRIES * sizeof(Memo))
        for t in range(s):
            h = (h ^ <uint64_t>self.rec[t]) * <uint64_t>0x9E3779B97F4A7C15
        e = &self.memo[(h >> 40) % MEMO_ENTRIES]
        if e.live:
            for t in range(s):
                if e.ctx[t] != self.rec[t]:
                    break
            else:
                if not self.sp.key_cols.shape[0] or same_cells(
                        self.st, self.sp.key_cols, e.key_seq, self.last_seq):
                    return e
        for t in range(s):
            e.ctx[t] = self.rec[t]
        e.key_seq, e.hi, e.live = self.last_seq, self._left_ts(s) + 1, True
        e.m = e.n_nodes = 0
        self._memo_reserve(e, 1, 0)
        e.node_start[0] = 0
        return e

    cdef int _memo_reserve(self, Memo* e, idx_t cands, idx_t nodes) except -1 nogil:
        cdef idx_t cap
        if cands > e.cand_cap:
            cap = max(e.cand_cap * 2, <idx_t>MIN_STACK, cands)
            e.cand = <int64_t*>grow(e.cand, cap * sizeof(int64_t))
            e.cand_ts = <int64_t*>grow(e.cand_ts, cap * sizeof(int64_t))
            e.node_start = <idx_t*>grow(e.node_start, (cap + 1) * sizeof(idx_t))
            e.cand_cap = cap
        if nodes > e.node_cap:
            cap = max(e.node_cap * 2, <idx_t>MIN_STACK, nodes)
            e.node = <int64_t*>grow(e.node, cap * sizeof(int64_t))
            e.node_last = <idx_t*>grow(e.node_last, cap * sizeof(idx_t))
            e.node_cap = cap
        return 0

    cdef int _memo_node(self, Memo* e, int64_t parent, idx_t j) except -1 nogil:
        self._memo_reserve(e, 0, e.n_nodes + 1)
        e.node[e.n_nodes] = self.ls.append(self.st, parent, e.cand[j])
        e.node_last[e.n_nodes] = j
        e.n_nodes += 1
        return 0

    cdef int _memo_extend(self, Memo* e, idx_t s, int64_t hi) except -1 nogil:
        """Take the candidates with ts in [e.hi, hi) and make the lists ending with each:
        it alone, and each earlier list (ending before its ts) it may extend."""
        cdef Stack* stack = &self.part[s]
        cdef idx_t jj, j, q, prior
        cdef int64_t seq
        for jj in range(_below(stack, e.hi), _below(stack, hi)):
            seq = stack.seq[jj]
            if self.sp.key_cols.shape[0] and not same_cells(self.st, self.sp.key_cols,
                                                            seq, self.last_seq):
                continue
            if not self._holds_element(s, G_BIND, -1, seq):
                continue
            j = e.m
            self._memo_reserve(e, j + 1, 0)
            e.cand[j], e.cand_ts[j] = seq, stack.ts[jj]
            prior = e.n_nodes
            if self._holds_element(s, G_ITER, -1, seq):
                self._memo_node(e, -1, j)
            for q in range(prior):
                if e.cand_ts[e.node_last[q]] < e.cand_ts[j] and \
                        self._holds_element(s, G_ITER, e.node[q], seq):
                    self._memo_node(e, e.node[q], j)
            e.m = j + 1
            e.node_start[e.m] = e.n_nodes
        e.hi = hi
        return 0

    cdef int _close(self, idx_t i, idx_t s, int64_t parent) except -1 nogil:
        """A trailing list: the list ``parent`` (-1: empty) with the last event appended."""
        cdef int64_t handle
        if not self._holds_element(s, G_ITER, parent, self.last_seq):
            return 0
        handle = self.ls.append(self.st, parent, self.last_seq)
        self.rec[s] = handle
        self.list_step(i + 1)
        self.rec[s] = -1
        return 0

    cdef int _write_ids(self) except -1 nogil:
        """A match as a query's output: its end and its events' user ids."""
        cdef idx_t j
        cdef int64_t seq
        cdef int64_t* row
        if self.limit and self.n_out >= self.limit:
            with gil:
                raise StateBudgetExceeded(f"{self.n_out + 1} records, the budget is "
                                          f"{self.limit}")
        if self.n_out == self.cap_out:
            self._grow_out()
        self.det_buf[self.n_out] = self.last_ts
        row = self.ids_buf + self.n_out * self.n_vars
        for j in range(self.n_vars):
            seq = self.rec[self.var_slots[j]]
            row[j] = self.st.ids[self.st.row(seq)] if seq >= 0 else -1
        self.n_out += 1
        self.made += 1
        return 0

    cdef int finish(self) except -1 nogil:
        """Every slot bound: a match if the whole-match conditions hold."""
        cdef int64_t* o
        cdef int64_t start
        cdef idx_t k = self.sp.k, s
        if self.gf[3 * k] != self.ps.n and not (
                self.ps.holds_range(self.st, self.rec, self.gf[3 * k], self.ps.n)
                if not self.ps.reads_lists else self.ps.holds_lists(
                    self.st, self.ls, self.rec, self.is_list, k, self.gf[3 * k], self.ps.n)):
            return 0
        if self.direct:
            return self._write_ids()
        start = self.ls.start[ls_row(self.ls, self.rec[0])] if self.is_list[0] \
            else self.rec_ts[0]
        o = ring_push(self.out)
        o[COL_START] = start
        o[COL_END] = self.last_ts
        o[COL_KEY] = self.key
        for s in range(k):
            o[COL_IDS + s] = self.rec[s]
        self.made += 1
        return 0


cdef object _owned(int64_t* data, idx_t rows, idx_t cols):
    """A numpy array over ``data`` (rows x cols, or rows when cols is 0) that frees it
    when it goes: the kernel's buffer handed over, not copied."""
    cdef cvarray a
    cdef object shape
    if cols:
        shape = (rows, cols)
    else:
        shape = (rows,)
    if rows == 0:
        free(data)
        return np.empty(shape, dtype=np.int64)
    a = cvarray(shape=shape, itemsize=sizeof(int64_t), format="q", mode="c",
                allocate_buffer=False)
    a.data = <char*>data
    a.callback_free_data = free
    return np.asarray(a)


def chain_step(ChainSpec sp, ChainStacks stacks, EventStore st, ListStore ls,
               const int64_t[::1] seqs, const int64_t[::1] ts, const int32_t[::1] types,
               const int64_t[::1] keys, const uint8_t[::1] keyed, RingBuffer out):
    """Events in ts order (``seqs`` in the store, ``ts``, ``types``: the operator's
    type codes, -1 for any other event), each with its partition key (``keys``: the
    [attr] hash where the operator has [attr], else 0) and whether it carries the
    [attr] values (``keyed``). Matches go to ``out`` (k ids: per slot an event or a
    list handle). Returns the number of matches."""
    if out.n_ids != sp.k:
        raise ValueError(f"a chain of {sp.k} slots needs records of {sp.k} ids")
    cdef _Build b = _Build()
    b.out = out
    _run(b, sp, stacks, st, ls, seqs, ts, types, keys, keyed)
    return b.made


def chain_step_ids(ChainSpec sp, ChainStacks stacks, EventStore st, ListStore ls,
                   const int64_t[::1] seqs, const int64_t[::1] ts,
                   const int32_t[::1] types, const int64_t[::1] keys,
                   const uint8_t[::1] keyed, const int64_t[::1] var_slots, idx_t limit):
    """``chain_step`` whose matches are a query's output as they are (no list, no
    condition or NOT of the query's own): (detected, ids[n, len(var_slots)]), the
    user ids of the events in the slots ``var_slots`` names, written as the matches
    are made (no records in between). More than ``limit`` matches (0: no limit)
    raise StateBudgetExceeded."""
    cdef idx_t j
    for j in range(var_slots.shape[0]):
        if not 0 <= var_slots[j] < sp.k or sp.slot_kleene[var_slots[j]]:
            raise ValueError(f"slot {var_slots[j]} is not a plain slot of the chain")
    cdef _Build b = _Build()
    b.direct, b.limit, b.n_vars = True, limit, var_slots.shape[0]
    b.var_slots = &var_slots[0] if b.n_vars else NULL
    _run(b, sp, stacks, st, ls, seqs, ts, types, keys, keyed)
    detected, ids = _owned(b.det_buf, b.n_out, 0), _owned(b.ids_buf, b.n_out, b.n_vars)
    b.det_buf = b.ids_buf = NULL   # theirs now
    return detected, ids


cdef int _run(_Build b, ChainSpec sp, ChainStacks stacks, EventStore st, ListStore ls,
              const int64_t[::1] seqs, const int64_t[::1] ts, const int32_t[::1] types,
              const int64_t[::1] keys, const uint8_t[::1] keyed) except -1:
    cdef idx_t n = seqs.shape[0], j, s, k = sp.k
    cdef int32_t t
    cdef int64_t cutoff
    cdef Stack* part
    cdef Stack* unkeyed = NULL
    cdef bint has_key = sp.key_cols.shape[0] > 0
    cdef int64_t none[MAX_CHAIN_SLOTS]
    if ts.shape[0] != n or types.shape[0] != n or keys.shape[0] != n or keyed.shape[0] != n:
        raise ValueError("seqs, ts, types, keys and keyed must have one entry per event")
    if stacks.k != k:
        raise ValueError(f"a chain of {k} slots needs stacks of {k} slots")
    for s in range(k):
        if stacks.left_plain[s] != (s > 0 and not sp.slot_kleene[s] and not sp.slot_kleene[s - 1]):
            raise ValueError("the stacks were made for a chain of other slot kinds")
    sp.conds.check_lists_inputs(st, k)
    for s in range(sp.key_cols.shape[0]):
        if not 0 <= sp.key_cols[s] < st.n_attrs:
            raise ValueError("an [attr] column is not in the event store")
    b.sp, b.ps, b.st, b.ls = sp, sp.conds, st, ls
    b.gf, b.is_list = &sp.group_first[0], &sp.slot_kleene[0]
    for s in range(k):
        b.right_plain[s] = -1
        for j in range(s + 1, k):
            if not sp.slot_kleene[j]:
                b.right_plain[s] = <int32_t>j
                break
    b.n_plain = b.n_lists = 0
    for s in range(k - 1, -1, -1):
        if not sp.slot_kleene[s]:
            b.plain[b.n_plain] = s
            b.n_plain += 1
    for s in range(k):
        b.rec[s] = none[s] = b.rec_rip[s] = -1
        if sp.slot_kleene[s]:
            b.lists[b.n_lists] = s
            b.n_lists += 1
    b.memo_slot = _memo_slot(sp)
    with nogil:
        if not has_key:
            unkeyed = &stacks.stacks[stacks._partition(0) * k]
        for j in range(n):
            t = types[j]
            if t < 0 or (has_key and not keyed[j]):
                continue   # no slot's type, or without the [attr] values: in no partition
            for s in range(k):
                if sp.slot_type[s] == t:
                    break
            else:
                continue   # another query's type: no partition looked up (one chain per
                           # query, each handed every event of the batch)
            part = &stacks.stacks[stacks._partition(keys[j]) * k] if has_key else unkeyed
            cutoff = ts[j] - sp.window
            # the enumeration reads events before this one only: then it is stacked
            if t == sp.slot_type[k - 1] and _filter(b, k - 1, seqs[j], &none[0]):
                for s in range(k):
                    stacks._prune(&part[s], cutoff)
                b.part = part
                b.last_seq, b.last_ts, b.key, b.floor = seqs[j], ts[j], keys[j], cutoff
                b.plain_step(0)
            for s in range(k):
                if sp.slot_type[s] != t or (s == k - 1 and not sp.slot_kleene[s]):
                    continue   # nothing is bound from the last slot's stack but a list
                if _filter(b, s, seqs[j], &none[0]):
                    stacks._prune(&part[s], cutoff)
                    stacks._push(&part[s], seqs[j], ts[j], part[s - 1].dropped + _below(
                        &part[s - 1], ts[j]) if stacks.left_plain[s] else -1)
    return 0


cdef idx_t _memo_slot(ChainSpec sp):
    """The first Kleene slot, after the first slot and before the last, whose bind
    and iteration conditions read no slot after it: its lists depend on the binding
    of the slots before it and on its right bound only, so they are kept per binding
    (``_Build.memo_step``); -1 if there is none."""
    cdef PredicateSet ps = sp.conds
    cdef idx_t s, p, j
    cdef bint left_only
    for s in range(1, sp.k - 1):
        if not sp.slot_kleene[s]:
            continue
        left_only = True
        for p in range(sp.group_first[3 * s + G_BIND], sp.group_first[3 * s + G_ITER + 1]):
            for j in range(ps.slot_start[p], ps.slot_start[p + 1]):
                if s < ps.slots[j] < sp.k:
                    left_only = False
            for j in range(ps.rng_start[p], ps.rng_start[p + 1]):
                if ps.rng_slot[j] > s:
                    left_only = False
            for j in range(ps.ext_start[p], ps.ext_start[p + 1]):
                if ps.ext_slot[j] > s:
                    left_only = False
        if left_only:
            return s
    return -1


cdef inline bint _filter(_Build b, idx_t s, int64_t seq, int64_t* none) noexcept nogil:
    """Does event seq pass slot s's own conditions (``none``: a record with no slot
    bound)?"""
    cdef idx_t first = <idx_t>b.gf[3 * s], last = <idx_t>b.gf[3 * s + 1]
    cdef bint ok
    if first == last:
        return True
    if not b.ps.reads_lists:   # plain conditions: the interpreter straight away
        none[s] = seq
        ok = b.ps.holds_range(b.st, none, first, last)
        none[s] = -1
        return ok
    return b.ps.holds_placed(b.st, b.ls, none, b.is_list, b.sp.k, s, -1, seq, first, last)


def match_ids(RingBuffer out, EventStore st, const int64_t[::1] var_slots):
    """The matches a RUN vertex wrote to ``out`` as a query's output, in one pass:
    (detected: each match's end, ids[n, len(var_slots)]: the user ids of the events
    in the slots ``var_slots`` names, in the query's variable order). For a query whose
    OUTPUT checks nothing more and binds no list (the engine's plain output)."""
    cdef idx_t n = out.size, m = var_slots.shape[0], i, j
    cdef int64_t s, bad = -1
    cdef int64_t* row
    for j in range(m):
        if not 0 <= var_slots[j] < out.n_ids:
            raise ValueError(f"slot {var_slots[j]} is not one of the {out.n_ids} of the records")
    detected = np.empty(n, dtype=np.int64)
    ids = np.empty((n, m), dtype=np.int64)
    cdef int64_t[::1] d = detected
    cdef int64_t[:, ::1] o = ids
    with nogil:
        for i in range(n):
            row = ring_row(out, i)
            d[i] = row[COL_END]
            for j in range(m):
                s = row[COL_IDS + var_slots[j]]
                if s < 0:
                    o[i, j] = -1
                elif s < st.base or s >= st.next_seq:
                    bad = s
                    o[i, j] = -1
                else:
                    o[i, j] = st.ids[st.row(s)]
    if bad >= 0:
        raise ValueError(f"a match holds event {bad}, which the store no longer has")
    return detected, ids
