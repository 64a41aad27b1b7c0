"""SASE's automata: the baseline engine's matching (``dqcep.baseline``).

``SaseNFA``: SASE's sequence scan and construction (Wu, Diao, Rizzi, SIGMOD 2006)
for a query ``SEQ(T0 v0, ..., Tn-1 vn-1)`` under skip-till-any-match (with
negated types in its gaps). The NFA has a state per positive item and an *active
instance stack* per state; with ``[attr]`` equivalence tests the stacks are
partitioned by the attribute values (PAIS), one set of stacks per partition.

- Scan: an event of type Ts that passes the single-variable predicates of vs
  is pushed onto stack s (states in descending order, so an event that could
  fill two states never points at itself) if stack s-1 is not empty, with a
  pointer (RIP) to the most recent instance of stack s-1. An event of the last
  state is not pushed: it starts construction at once (nothing ever points at
  the last stack).
- Construction: a depth-first walk back through the pointers: at stack s-1
  every instance at or below the pointer is a candidate (skip-till-any-match);
  a candidate must be strictly earlier than the instance after it and inside
  the window (stacks are in ts order, so the walk stops at the first one that
  is too old). Multi-variable predicates are evaluated as soon as their
  variables are bound; ``[attr]`` inside a larger condition on the complete
  sequence.
- Window pruning drops instances older than (newest ts - W) from the bottom
  of the stacks; the pointers are absolute positions, so they stay valid.

``SaseRunNFA``: SASE+'s NFA^b (Agrawal, Diao, Gyllstrom, Immerman, SIGMOD 2008)
for Kleene items and the selection strategies (spec 5): runs that take, begin,
proceed or ignore each event, cloned where the strategy leaves a choice.

Both (``SaseAutomaton``) check negation on each complete match: every negated
type keeps its filtered events in ts order; a gap or leading NOT searches its
interval at once; a trailing NOT holds the match until the watermark passes
start + W (``release``). Matches come out as rows of sequence numbers (list
handles for Kleene states). Every loop over events, instances, runs and
candidates runs without the GIL.
"""
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memmove

import numpy as np

from dqcep._kernels._alloc cimport grow
from dqcep._kernels._table cimport table_free, table_get, table_init, table_set
from dqcep._kernels._types cimport idx_t, ts_t
from dqcep._kernels.predicates cimport PredicateSet
from dqcep._kernels.store cimport (KIND_MISSING, EventStore, ListStore, cell_hash, ls_row,
                                   same_cells)

cdef enum:
    NEG_GAP = 0
    NEG_LEADING = 1
    NEG_TRAILING = 2
    MIN_STACK = 16

NEG_MODES = {"GAP": NEG_GAP, "LEADING": NEG_LEADING, "TRAILING": NEG_TRAILING}

# SaseRunNFA: selection strategies and the words of a run row
cdef enum:
    S_ANY = 0
    S_NEXT = 1
    S_STRICT = 2
    S_PARTITION = 3
    MAX_STATES = 32
    RW_START = 0          # ts of its first event
    RW_LAST = 1           # ts of its last event
    RW_POS = 2            # the state of its last event
    RW_FIRST = 3          # sequence number of its first event
    RW_SLOTS = 4          # then per state: an event's sequence number or a list handle

STRATEGIES = {"skip-till-any-match": S_ANY, "skip-till-next-match": S_NEXT,
              "strict-contiguity": S_STRICT, "partition-contiguity": S_PARTITION}


# ---------------------------------------------------------------- one stack

cdef int _stack_realloc(Stack* s, int64_t cap) except -1 nogil:
    cdef int64_t live = s.hi - s.lo
    if s.lo > s.offset and live:   # drop the pruned bottom first
        memmove(s.seq, s.seq + (s.lo - s.offset), live * sizeof(int64_t))
        memmove(s.ts, s.ts + (s.lo - s.offset), live * sizeof(int64_t))
        memmove(s.rip, s.rip + (s.lo - s.offset), live * sizeof(int64_t))
    s.offset = s.lo
    if cap == s.cap:
        return 0
    s.seq = <int64_t*>grow(s.seq, cap * sizeof(int64_t))
    s.ts = <int64_t*>grow(s.ts, cap * sizeof(int64_t))
    s.rip = <int64_t*>grow(s.rip, cap * sizeof(int64_t))
    s.cap = cap
    return 0
    return 0


cdef inline int _stack_push(Stack* s, int64_t seq, int64_t ts, int64_t rip) except -1 nogil:
    cdef int64_t i
    if s.hi - s.offset == s.cap:
        if (s.hi - s.lo) * 2 <= s.cap and s.cap:
            _stack_realloc(s, s.cap)            # room at the bottom: compact in place
        else:
            _stack_realloc(s, s.cap * 2 if s.cap else MIN_STACK)
    i = s.hi - s.offset
    s.seq[i] = seq
    s.ts[i] = ts
    s.rip[i] = rip
    s.hi += 1
    return 0


cdef inline int64_t _stack_prune(Stack* s, ts_t cutoff) except -1 nogil:
    """Drop instances with ts < cutoff from the bottom; shrink a sparse stack."""
    cdef int64_t start = s.lo, live
    while s.lo < s.hi and s.ts[s.lo - s.offset] < cutoff:
        s.lo += 1
    live = s.hi - s.lo
    if live == 0 and s.cap:
        free(s.seq)
        free(s.ts)
        free(s.rip)
        s.seq = s.ts = s.rip = NULL
        s.cap = 0
        s.offset = s.lo
    elif s.cap > MIN_STACK and live * 4 < s.cap:
        _stack_realloc(s, s.cap // 2)
    return s.lo - start


cdef inline void _stack_free(Stack* s) noexcept nogil:
    free(s.seq)
    free(s.ts)
    free(s.rip)
    s.seq = s.ts = s.rip = NULL


cdef inline int64_t _first_at_or_after(Stack* s, ts_t t, bint strictly) noexcept nogil:
    """Absolute position of the first live element with ts >= t (> t if strictly)."""
    cdef int64_t lo = s.lo, hi = s.hi, mid, v
    while lo < hi:
        mid = (lo + hi) >> 1
        v = s.ts[mid - s.offset]
        if v < t or (strictly and v == t):
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef bint _blocked(Stack* B, PredicateSet ps, EventStore st, ListStore ls, int64_t* rec,
                   const uint8_t* is_list, idx_t width, idx_t slot, idx_t first, idx_t last,
                   ts_t lo, bint lo_open, ts_t hi, bint hi_open) noexcept nogil:
    """Is there a buffered negated event in the interval (lo, hi; open or closed ends)
    for which predicates first..last-1 hold with it in ``slot`` of ``rec``? Records
    with lists (``is_list`` not NULL) read them whole. ``rec[slot]`` is left -1."""
    cdef int64_t p = _first_at_or_after(B, lo, lo_open)
    cdef ts_t t
    cdef bint found = False
    while p < B.hi:
        t = B.ts[p - B.offset]
        if t > hi or (hi_open and t == hi):
            break
        rec[slot] = B.seq[p - B.offset]
        if ps.holds_range(st, rec, first, last) if is_list == NULL else \
                ps.holds_lists(st, ls, rec, is_list, width, first, last):
            found = True
            break
        p += 1
    rec[slot] = -1
    return found


cdef int _grow_rows(int64_t** buf, idx_t* cap, idx_t need, idx_t width) except -1 nogil:
    cdef idx_t c = cap[0] if cap[0] else 64
    while c < need:
        c *= 2
    if c == cap[0]:
        return 0
    buf[0] = <int64_t*>grow(buf[0], c * width * sizeof(int64_t))
    cap[0] = c
    return 0


# ------------------------------------------------------------ what both share

cdef class SaseAutomaton:
    """What both automata share: the states' types, the [attr] partitions, the
    negated events' buffers and the negation checks on a complete match, matches
    held for a trailing NOT, and the output rows.

    ``conds`` in groups (``ranges[g]:ranges[g+1]``): g < n checked as state g is
    bound (SaseNFA: the predicates whose lowest slot is g; SaseRunNFA: placed by
    ``run_placement``), g = n on the complete match, g = n + 1 + j those of
    negation j, with the negated event in record slot n + j. ``scan_preds``: the
    single-variable ones (SaseNFA: every slot; SaseRunNFA: negated variables).
    """

    def __cinit__(self):
        self.negs = NULL
        self.held = NULL
        self.out_rows = NULL
        self.out_det = NULL
        self.rec = NULL
        self.flags = NULL

    cdef _setup(self, int64_t window, state_types, neg_types, neg_modes, neg_after,
                key_attrs, PredicateSet scan_preds, PredicateSet conds, ranges,
                idx_t scratch):
        """Checks and allocations; ``scratch``: words of scratch after the record."""
        cdef idx_t i
        self.state_type = np.ascontiguousarray(state_types, dtype=np.int32)
        self.neg_type = np.ascontiguousarray(neg_types, dtype=np.int32)
        self.neg_mode = np.ascontiguousarray(neg_modes, dtype=np.int8)
        self.neg_after = np.ascontiguousarray(neg_after, dtype=np.int64)
        self.key_attrs = np.ascontiguousarray(key_attrs, dtype=np.int32)
        self.ranges = np.ascontiguousarray(ranges, dtype=np.int64)
        self.n, self.m, self.window = self.state_type.shape[0], self.neg_type.shape[0], window
        if self.n < 1:
            raise ValueError("a SEQ needs at least one positive state")
        if self.neg_mode.shape[0] != self.m or self.neg_after.shape[0] != self.m:
            raise ValueError("negation arrays disagree in length")
        if self.ranges.shape[0] != self.n + self.m + 2:
            raise ValueError(f"expected {self.n + self.m + 2} range bounds")
        if self.ranges[self.ranges.shape[0] - 1] != conds.n:
            raise ValueError("ranges do not cover the conditions")
        self.scan_preds, self.conds = scan_preds, conds
        self.has_trailing = False
        for i in range(self.m):
            if self.neg_mode[i] == NEG_TRAILING:
                self.has_trailing = True
        self.rec = <int64_t*>malloc((self.n + self.m + scratch) * sizeof(int64_t))
        self.negs = <Stack*>malloc((self.m + 1) * sizeof(Stack))
        if self.rec == NULL or self.negs == NULL:
            raise MemoryError()
        table_init(&self.part_of, 64)
        for i in range(self.m):
            self.negs[i] = Stack(NULL, NULL, NULL, 0, 0, 0, 0)
        self.n_parts = self.parts_cap = 0
        self.n_held = self.held_cap = self.n_out = self.out_cap = 0
        self.pruned = self.live = self.live_peak = 0

    def __dealloc__(self):
        cdef idx_t i
        if self.negs != NULL:
            for i in range(self.m):
                _stack_free(&self.negs[i])
        free(self.negs)
        table_free(&self.part_of)
        free(self.held)
        free(self.out_rows)
        free(self.out_det)
        free(self.rec)

    cdef int _resize_parts(self, idx_t cap) except -1 nogil:
        return 0

    cdef idx_t _partition(self, uint64_t key) except -1 nogil:
        """Index of the partition of ``key``, created (``_resize_parts``) if new."""
        cdef int64_t p = table_get(&self.part_of, <int64_t>key)
        if p >= 0:
            return <idx_t>p
        if self.n_parts == self.parts_cap:
            self._resize_parts(2 * self.parts_cap if self.parts_cap else 4)
            self.parts_cap = 2 * self.parts_cap if self.parts_cap else 4
        p = self.n_parts
        self.n_parts += 1
        table_set(&self.part_of, <int64_t>key, p)
        return <idx_t>p

    cdef bint _key(self, EventStore st, idx_t r, uint64_t* key) noexcept nogil:
        """The hash of event row r's [attr] values; False if it lacks one."""
        cdef idx_t a
        cdef int64_t c
        key[0] = 0
        for a in range(self.key_attrs.shape[0]):
            c = r * st.n_attrs + self.key_attrs[a]
            if st.kind[c] == KIND_MISSING:
                return False
            key[0] = key[0] * <uint64_t>0x100000001b3 ^ cell_hash(st.kind[c], st.val[c])
        return True

    cdef int _buffer_negated(self, EventStore st, int64_t seq, ts_t ts,
                             int32_t etype) except -1 nogil:
        """Event seq into the buffer of each negation of its type that it passes."""
        cdef idx_t j, a
        for j in range(self.m):
            if self.neg_type[j] != etype:
                continue
            for a in range(self.n + self.m):
                self.rec[a] = -1
            self.rec[self.n + j] = seq
            if self.scan_preds.holds(st, self.rec):
                _stack_push(&self.negs[j], seq, ts, -1)
        return 0

    cdef ts_t _start_of(self, EventStore st, idx_t s, int64_t v) noexcept nogil:
        """Start ts of state s's binding v (an event, or a list handle)."""
        if self.flags != NULL and self.flags[s]:
            return self.lists.start[ls_row(self.lists, v)]
        return st.ts[st.row(v)]

    cdef ts_t _end_of(self, EventStore st, idx_t s, int64_t v) noexcept nogil:
        if self.flags != NULL and self.flags[s]:
            return self.lists.end[ls_row(self.lists, v)]
        return st.ts[st.row(v)]

    cdef bint _violated(self, EventStore st, idx_t j, ts_t lo, bint lo_open, ts_t hi,
                        bint hi_open) noexcept nogil:
        """Is there an event of negation j in the interval that its conjuncts accept
        (the match in rec)?"""
        cdef idx_t g = self.n + 1 + j
        return _blocked(&self.negs[j], self.conds, st, self.lists, self.rec, self.flags,
                        self.n + self.m, self.n + j, self.ranges[g], self.ranges[g + 1],
                        lo, lo_open, hi, hi_open)

    cdef int _finish(self, EventStore st) except -1 nogil:
        """A match is bound in rec (rec[n:n+m] = -1) and its conditions hold: the gap
        and leading negations, then emitted, or held for a trailing NOT."""
        cdef idx_t j, a, n = self.n
        cdef ts_t start = self._start_of(st, 0, self.rec[0])
        cdef ts_t end = self._end_of(st, n - 1, self.rec[n - 1])
        for j in range(self.m):
            if self.neg_mode[j] == NEG_GAP:
                a = self.neg_after[j]
                if self._violated(st, j, self._end_of(st, a, self.rec[a]), True,
                                  self._start_of(st, a + 1, self.rec[a + 1]), True):
                    return 0
            elif self.neg_mode[j] == NEG_LEADING:
                if self._violated(st, j, end - self.window, False, start, True):
                    return 0
        if self.has_trailing:
            _grow_rows(&self.held, &self.held_cap, self.n_held + 1, n)
            memcpy(self.held + self.n_held * n, self.rec, n * sizeof(int64_t))
            self.n_held += 1
            return 0
        return self._emit(self.rec, end)

    cdef int _emit(self, const int64_t* slots, ts_t detected) except -1 nogil:
        cdef idx_t cap
        if self.n_out == self.out_cap:
            cap = self.out_cap
            _grow_rows(&self.out_det, &cap, self.n_out + 1, 1)
            _grow_rows(&self.out_rows, &self.out_cap, self.n_out + 1, self.n)
        memcpy(self.out_rows + self.n_out * self.n, slots, self.n * sizeof(int64_t))
        self.out_det[self.n_out] = detected
        self.n_out += 1
        return 0

    cdef void _born(self) noexcept nogil:
        self.live += 1
        if self.live > self.live_peak:
            self.live_peak = self.live

    # --------------------------------------------------- watermark, output
    def release(self, EventStore st, wm, bint everything=False):
        """Held matches (trailing NOT) whose start + W < wm, or all: checked, emitted."""
        cdef idx_t i, j, kept = 0, n = self.n
        cdef ts_t start, end, mark = 0 if wm is None else <ts_t>wm
        cdef bint ok
        with nogil:
            for i in range(self.n_held):
                memcpy(self.rec, self.held + i * n, n * sizeof(int64_t))
                for j in range(n, n + self.m):
                    self.rec[j] = -1
                start = self._start_of(st, 0, self.rec[0])
                if not everything and start + self.window >= mark:
                    memcpy(self.held + kept * n, self.rec, n * sizeof(int64_t))
                    kept += 1
                    continue
                end = self._end_of(st, n - 1, self.rec[n - 1])
                ok = True
                for j in range(self.m):
                    if self.neg_mode[j] == NEG_TRAILING and self._violated(
                            st, j, end, True, start + self.window, False):
                        ok = False
                        break
                if ok:
                    self._emit(self.rec, start + self.window)
            self.n_held = kept

    def held_min_start(self, EventStore st):
        """Smallest start ts of a held match (None: none held)."""
        cdef idx_t i
        cdef ts_t best = 0, t
        if self.n_held == 0:
            return None
        for i in range(self.n_held):
            t = self._start_of(st, 0, self.held[i * self.n])
            if i == 0 or t < best:
                best = t
        return best

    def take(self):
        """(detected_at int64[k], rows int64[k, n]) of the matches emitted since the last
        take: per state an event's sequence number (a list handle for a Kleene state)."""
        det = np.empty(self.n_out, dtype=np.int64)
        rows = np.empty((self.n_out, self.n), dtype=np.int64)
        cdef int64_t[::1] d = det
        cdef int64_t[:, ::1] o = rows
        if self.n_out:
            memcpy(&d[0], self.out_det, self.n_out * sizeof(int64_t))
            memcpy(&o[0, 0], self.out_rows, self.n_out * self.n * sizeof(int64_t))
        self.n_out = 0
        return det, rows

    cdef int64_t _shared_nbytes(self):
        """Bytes of the negation buffers, the partition table, held and pending output."""
        cdef idx_t i
        cdef int64_t total = 0
        for i in range(self.m):
            total += self.negs[i].cap * 3 * sizeof(int64_t)
        total += (self.part_of.mask + 1) * sizeof(Int64Slot)
        total += self.held_cap * self.n * sizeof(int64_t)
        total += self.out_cap * (self.n + 1) * sizeof(int64_t)
        return total

    @property
    def partitions(self):
        return self.n_parts


# ------------------------------------------------------------ SASE: stacks

cdef class SaseNFA(SaseAutomaton):
    """SaseNFA(window, state_types, neg_types, neg_modes, neg_after, key_attrs,
    scan_preds, build_preds, ranges): SEQ under skip-till-any-match by active
    instance stacks (see the module docstring); ``build_preds`` are the
    ``SaseAutomaton`` groups, g < n the predicates whose lowest slot is g."""

    def __cinit__(self):
        self.stacks = NULL
        self.tsb = NULL
        self.pos = NULL

    def __init__(self, int64_t window, state_types, neg_types, neg_modes, neg_after,
                 key_attrs, PredicateSet scan_preds, PredicateSet build_preds, ranges):
        self._setup(window, state_types, neg_types, neg_modes, neg_after, key_attrs,
                    scan_preds, build_preds, ranges, 0)
        self.tsb = <int64_t*>malloc(self.n * sizeof(int64_t))
        self.pos = <int64_t*>malloc(self.n * sizeof(int64_t))
        if self.tsb == NULL or self.pos == NULL:
            raise MemoryError()
        self.pushed = self.constructed = 0

    def __dealloc__(self):
        cdef idx_t i
        if self.stacks != NULL:
            for i in range(self.n_parts * self.n):
                _stack_free(&self.stacks[i])
        free(self.stacks)
        free(self.tsb)
        free(self.pos)

    cdef int _resize_parts(self, idx_t cap) except -1 nogil:
        cdef idx_t i
        self.stacks = <Stack*>grow(self.stacks, cap * self.n * sizeof(Stack))
        for i in range(self.parts_cap * self.n, cap * self.n):
            self.stacks[i] = Stack(NULL, NULL, NULL, 0, 0, 0, 0)
        return 0

    # ------------------------------------------------------------------ scan
    def scan(self, EventStore st, const int64_t[::1] seqs, const int32_t[::1] types):
        """Feed stored events (sequence numbers, engine type codes), in ts order."""
        cdef idx_t i
        if types.shape[0] != seqs.shape[0]:
            raise ValueError("scan: seqs and types disagree in length")
        with nogil:
            for i in range(seqs.shape[0]):
                self._event(st, seqs[i], types[i])

    cdef int _event(self, EventStore st, int64_t seq, int32_t etype) except -1 nogil:
        cdef idx_t r = st.row(seq), s, a, part = -1, width = self.n + self.m
        cdef ts_t ts = st.ts[r]
        cdef uint64_t key = 0
        cdef Stack* prev
        cdef int64_t rip, dropped
        self._buffer_negated(st, seq, ts, etype)
        for s in range(self.n - 1, -1, -1):
            if self.state_type[s] != etype:
                continue
            for a in range(width):
                self.rec[a] = -1
            self.rec[s] = seq
            if not self.scan_preds.holds(st, self.rec):
                continue
            if part < 0:   # the event's partition, found once
                if not self._key(st, r, &key):
                    return 0   # [attr] needs the attribute: no state takes it
                part = self._partition(key)
            rip = -1
            if s > 0:
                prev = &self.stacks[part * self.n + s - 1]
                dropped = _stack_prune(prev, ts - self.window)
                self.pruned += dropped
                self.live -= dropped
                if prev.hi == prev.lo:
                    continue
                rip = prev.hi - 1
            if s == self.n - 1:
                self._construct(st, part, seq, ts, rip)
            else:
                _stack_push(&self.stacks[part * self.n + s], seq, ts, rip)
                self.pushed += 1
                self._born()
        return 0

    # ---------------------------------------------------------- construction
    cdef int _construct(self, EventStore st, idx_t part, int64_t seq, ts_t end,
                        int64_t rip) except -1 nogil:
        cdef idx_t k, a, n = self.n
        cdef int64_t c
        cdef ts_t oldest = end - self.window, t
        cdef Stack* S
        for a in range(n + self.m):
            self.rec[a] = -1
        self.rec[n - 1] = seq
        self.tsb[n - 1] = end
        if not self.conds.holds_range(st, self.rec, self.ranges[n - 1],
                                            self.ranges[n]):
            return 0
        if n == 1:
            return self._complete(st)
        k = n - 2
        self.pos[k] = rip
        while True:
            S = &self.stacks[part * n + k]
            c = self.pos[k]
            if c < S.lo or S.ts[c - S.offset] < oldest:
                k += 1                       # depth k exhausted: back up one
                if k == n - 1:
                    return 0
                self.pos[k] -= 1
                continue
            t = S.ts[c - S.offset]
            self.pos[k] = c - 1
            if t >= self.tsb[k + 1]:         # SEQ order is strict: equal ts do not chain
                continue
            self.rec[k] = S.seq[c - S.offset]
            self.tsb[k] = t
            if not self.conds.holds_range(st, self.rec, self.ranges[k],
                                                self.ranges[k + 1]):
                continue
            if k == 0:
                self._complete(st)
                continue
            self.pos[k] = c                  # resumes below c when depth k - 1 is done
            k -= 1
            self.pos[k] = S.rip[c - S.offset]

    cdef int _complete(self, EventStore st) except -1 nogil:
        """A sequence is bound in rec: final predicates, then negations."""
        cdef idx_t n = self.n
        self.constructed += 1
        if not self.conds.holds_range(st, self.rec, self.ranges[n], self.ranges[n + 1]):
            return 0
        return self._finish(st)

    def prune(self, ts_t cutoff, ts_t neg_cutoff):
        """Window pruning of every partition's stacks (ts < cutoff) and of the
        negation buffers (ts < neg_cutoff)."""
        cdef idx_t i
        cdef int64_t dropped
        with nogil:
            for i in range(self.n_parts * self.n):
                dropped = _stack_prune(&self.stacks[i], cutoff)
                self.live -= dropped
                self.pruned += dropped
            for i in range(self.m):
                _stack_prune(&self.negs[i], neg_cutoff)

    @property
    def nbytes(self):
        """Bytes of the stacks, negation buffers, held and pending output."""
        cdef idx_t i
        cdef int64_t total = self._shared_nbytes()
        for i in range(self.n_parts * self.n):
            total += self.stacks[i].cap * 3 * sizeof(int64_t)
        return total + self.parts_cap * self.n * sizeof(Stack)

    @property
    def instances(self):
        """Instances alive in the stacks now."""
        return self.live


# ------------------------------------------------------------ SASE+: runs

cdef int64_t* _runs_add(Runs* R, const int64_t* row, idx_t width) except NULL nogil:
    """Append a copy of ``row``; returns where it went (earlier row pointers of R may move)."""
    cdef int64_t cap
    if R.n == R.cap:
        cap = R.cap * 2 if R.cap else 8
        R.rows = <int64_t*>grow(R.rows, cap * width * sizeof(int64_t))
        R.cap = cap
    memcpy(R.rows + R.n * width, row, width * sizeof(int64_t))
    R.n += 1
    return R.rows + (R.n - 1) * width


cdef class SaseRunNFA(SaseAutomaton):
    """SaseRunNFA(strategy, window, state_types, state_lists, neg_types, neg_modes,
    neg_after, key_attrs, scan_preds, conds, ranges, list_aggs)

    SASE+'s NFA^b for a SEQ with Kleene items under a selection strategy (spec 5).
    One state per SEQ item; a *run* is a partial match: the state of its last event
    and its *buffer*, per state an event or a Kleene list (kept in a ListStore,
    whose lists share their prefixes: SASE+'s versioned shared buffer). Each event,
    in stream order (ts, id), is offered to the runs of its partition (PAIS: the
    [attr] values; one partition under strict-contiguity):

    - *take* (a Kleene state again) or *begin* the next state (after *proceed*) when
      the event fits the state (spec 5.2: type, ts after the run's last event, inside
      the window of its first, the [attr] values of its first, and the conditions
      ``conds[ranges[s]:ranges[s+1]]``, each checked once its variables are bound);
    - skip-till-any-match: the run is cloned for every edge it can take and also
      *ignores* the event (so the runs enumerate every match);
    - skip-till-next-match: it must take an edge it fits (cloned when it fits two),
      and ignores an event it fits nowhere;
    - strict- / partition-contiguity: as next-match, but an event it fits nowhere
      (any event; under partition-contiguity one with the run's [attr] values) ends it.

    A run in the last state is a match if the whole-match conditions
    (``ranges[n]:ranges[n+1]``: aggregates, v[last]) and the negations hold; in a
    trailing Kleene state it goes on. Every event that fits the first state begins
    a run. Events come through ``scan`` once no event can still come before them
    in stream order.
    """

    def __cinit__(self):
        self.parts = NULL

    def __init__(self, int strategy, int64_t window, state_types, state_lists, neg_types,
                 neg_modes, neg_after, key_attrs, PredicateSet scan_preds, PredicateSet conds,
                 ranges, list_aggs):
        n = len(state_lists)
        self.width = RW_SLOTS + n
        self._setup(window, state_types, neg_types, neg_modes, neg_after, key_attrs,
                    scan_preds, conds, ranges, self.width)   # scratch: one run row
        if strategy not in (S_ANY, S_NEXT, S_STRICT, S_PARTITION):
            raise ValueError(f"unknown strategy {strategy}")
        if not 1 <= self.n <= MAX_STATES or n != self.n:
            raise ValueError(f"a SEQ has 1..{MAX_STATES} states, one kind per state")
        if strategy == S_PARTITION and self.key_attrs.shape[0] == 0:
            raise ValueError("partition-contiguity needs [attr] columns")
        conds.check_slots(self.n + self.m)
        self.strategy = strategy
        lists = np.zeros(self.n + self.m, dtype=np.uint8)
        lists[:self.n] = np.asarray(state_lists, dtype=np.uint8)
        self.is_list = lists
        self.flags = &self.is_list[0]
        self.lists = ListStore(list_aggs)
        self.started = self.forked = 0

    def __dealloc__(self):
        cdef idx_t i
        if self.parts != NULL:
            for i in range(self.n_parts):
                free(self.parts[i].rows)
        free(self.parts)

    cdef int _resize_parts(self, idx_t cap) except -1 nogil:
        cdef idx_t i
        self.parts = <Runs*>grow(self.parts, cap * sizeof(Runs))
        for i in range(self.parts_cap, cap):
            self.parts[i] = Runs(NULL, 0, 0)
        return 0

    # ------------------------------------------------------------------ scan
    def scan(self, EventStore st, const int64_t[::1] seqs, const int32_t[::1] types):
        """Feed stored events (sequence numbers, engine type codes, -1: a type of no
        query) in stream order."""
        cdef idx_t i
        if types.shape[0] != seqs.shape[0]:
            raise ValueError("scan: seqs and types disagree in length")
        self.conds.check_lists_inputs(st, self.n + self.m)
        for i in range(self.key_attrs.shape[0]):
            if not 0 <= self.key_attrs[i] < st.n_attrs:
                raise ValueError("an [attr] column is not in the event store")
        with nogil:
            for i in range(seqs.shape[0]):
                self._event(st, seqs[i], types[i])

    cdef int _event(self, EventStore st, int64_t seq, int32_t etype) except -1 nogil:
        cdef idx_t r = st.row(seq), a, i, n0, kept, w = self.width, k = self.n
        cdef int64_t ts = st.ts[r], pos
        cdef uint64_t key = 0
        cdef bint relevant = False, key_ok, fit_same, fit_next, alive
        cdef Runs* R
        cdef int64_t* row
        cdef int64_t* scratch = self.rec + k + self.m   # RW_SLOTS + k words
        self._buffer_negated(st, seq, ts, etype)
        for a in range(k):
            if self.state_type[a] == etype:
                relevant = True
                break
        if not relevant and self.strategy <= S_NEXT:
            return 0            # fits no state: every run ignores it
        if self.strategy != S_STRICT and not self._key(st, r, &key):
            return 0            # without the [attr] values: in no partition, fits nothing
        R = &self.parts[self._partition(key)]
        n0 = R.n
        kept = 0
        for i in range(n0):
            row = R.rows + i * w
            alive = True
            if ts - row[RW_START] > self.window:
                alive = False   # no event it could still take can come
                self.pruned += 1
            else:
                key_ok = self.key_attrs.shape[0] == 0 or same_cells(
                    st, self.key_attrs, row[RW_FIRST], seq)
                if key_ok or self.strategy != S_PARTITION:   # else: another partition's
                    pos = row[RW_POS]
                    fit_same = key_ok and self.is_list[pos] and \
                        self._fits(st, row, pos, seq, ts, etype)
                    fit_next = key_ok and pos + 1 < k and \
                        self._fits(st, row, pos + 1, seq, ts, etype)
                    if self.strategy == S_ANY:      # clone per edge; this run ignores it
                        if fit_same:
                            self._clone(st, R, i, pos, seq, ts)
                        if fit_next:
                            self._clone(st, R, i, pos + 1, seq, ts)
                    elif fit_same:
                        if fit_next:
                            self._clone(st, R, i, pos + 1, seq, ts)
                        self._take(st, R.rows + i * w, pos, seq, ts)
                        if pos == k - 1:
                            self._complete(st, R.rows + i * w)
                    elif fit_next:
                        row = R.rows + i * w
                        self._take(st, row, pos + 1, seq, ts)
                        if pos + 1 == k - 1:
                            self._complete(st, row)
                            alive = self.is_list[k - 1] != 0   # a trailing list goes on
                    elif self.strategy != S_NEXT:
                        alive = False   # contiguity: it lay between
            if alive:
                if kept != i:
                    memcpy(R.rows + kept * w, R.rows + i * w, w * sizeof(int64_t))
                kept += 1
            else:
                self.live -= 1
        if kept != n0:     # the clones follow the runs kept
            memmove(R.rows + kept * w, R.rows + n0 * w, (R.n - n0) * w * sizeof(int64_t))
            R.n = kept + (R.n - n0)
        if etype == self.state_type[0] and (self.key_attrs.shape[0] == 0 or same_cells(
                st, self.key_attrs, seq, seq)):    # begin (with the [attr] values)
            scratch[RW_START], scratch[RW_LAST], scratch[RW_POS] = ts, ts - 1, -1
            scratch[RW_FIRST] = seq
            for a in range(k):
                scratch[RW_SLOTS + a] = -1
            if self._fits(st, scratch, 0, seq, ts, etype):
                self.started += 1
                self._take(st, scratch, 0, seq, ts)
                if k == 1:
                    self._complete(st, scratch)
                if k > 1 or self.is_list[0]:
                    _runs_add(R, scratch, w)
                    self._born()
        return 0

    cdef int _clone(self, EventStore st, Runs* R, idx_t i, idx_t s, int64_t seq,
                    int64_t ts) except -1 nogil:
        """A copy of run i takes event seq into state s (a non-deterministic edge); kept
        after the runs unless it completed a pattern that cannot grow."""
        cdef int64_t* copy = self.rec + self.n + self.m
        memcpy(copy, R.rows + i * self.width, self.width * sizeof(int64_t))
        self.forked += 1
        self._take(st, copy, s, seq, ts)
        if s == self.n - 1:
            self._complete(st, copy)
            if not self.is_list[s]:
                return 0
        _runs_add(R, copy, self.width)
        self._born()
        return 0

    cdef int _take(self, EventStore st, int64_t* row, idx_t s, int64_t seq,
                   int64_t ts) except -1 nogil:
        """Put event seq in state s of the run (a list grows by it, or begins)."""
        if self.is_list[s]:
            row[RW_SLOTS + s] = self.lists.append(
                st, row[RW_SLOTS + s] if s == row[RW_POS] else -1, seq)
        else:
            row[RW_SLOTS + s] = seq
        row[RW_POS] = s
        row[RW_LAST] = ts
        return 0

    cdef bint _fits(self, EventStore st, const int64_t* row, idx_t s, int64_t seq,
                    int64_t ts, int32_t etype) noexcept nogil:
        """Event seq fits state s of the run; the [attr] check is the caller's."""
        cdef int64_t slots[MAX_STATES]
        if etype != self.state_type[s] or ts <= row[RW_LAST] or \
                ts - row[RW_START] > self.window:
            return False
        memcpy(slots, row + RW_SLOTS, self.n * sizeof(int64_t))
        return self.conds.holds_placed(st, self.lists, slots, &self.is_list[0], self.n, s,
                                       slots[s] if s == row[RW_POS] else -1, seq,
                                       self.ranges[s], self.ranges[s + 1])

    cdef int _complete(self, EventStore st, const int64_t* row) except -1 nogil:
        """A run in the last state: the whole-match conditions, then negations."""
        cdef idx_t j, n = self.n
        if not self.conds.holds_lists(st, self.lists, row + RW_SLOTS, self.flags, n,
                                      self.ranges[n], self.ranges[n + 1]):
            return 0
        memcpy(self.rec, row + RW_SLOTS, n * sizeof(int64_t))
        for j in range(n, n + self.m):
            self.rec[j] = -1
        return self._finish(st)

    def prune(self, int64_t cutoff, int64_t neg_cutoff, int64_t list_cutoff):
        """Drop the runs that began before ``cutoff`` (nothing they could take can
        come), negated events before ``neg_cutoff`` and list nodes that end before
        ``list_cutoff`` (the oldest start a run or held match still reads)."""
        cdef idx_t p, i, kept, w = self.width
        cdef Runs* R
        with nogil:
            for p in range(self.n_parts):
                R = &self.parts[p]
                kept = 0
                for i in range(R.n):
                    if R.rows[i * w + RW_START] < cutoff:
                        continue
                    if kept != i:
                        memcpy(R.rows + kept * w, R.rows + i * w, w * sizeof(int64_t))
                    kept += 1
                self.pruned += R.n - kept
                self.live -= R.n - kept
                R.n = kept
                if kept == 0 and R.cap:
                    free(R.rows)
                    R.rows = NULL
                    R.cap = 0
            for i in range(self.m):
                _stack_prune(&self.negs[i], neg_cutoff)
            self.lists.evict_end_before(list_cutoff)

    @property
    def nbytes(self):
        """Bytes of the runs, the lists, the negation buffers, held and pending output."""
        cdef idx_t i
        cdef int64_t total = self._shared_nbytes() + self.parts_cap * sizeof(Runs)
        for i in range(self.n_parts):
            total += self.parts[i].cap * self.width * sizeof(int64_t)
        return total + self.lists.nbytes

    @property
    def runs(self):
        """Runs alive now."""
        return self.live
