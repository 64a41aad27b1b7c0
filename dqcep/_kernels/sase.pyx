"""SASE's sequence scan and construction (Wu, Diao, Rizzi, SIGMOD 2006).

One ``SaseNFA`` per query ``SEQ(T0 v0, ..., Tn-1 vn-1)`` (with negated types in
its gaps). The NFA has a state per positive item and an *active instance stack*
per state; with ``[attr]`` equivalence tests the stacks are partitioned by the
attribute values (PAIS), one set of stacks per partition.

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
- Negation is checked on each constructed sequence: every negated type keeps
  its filtered events in ts order; a gap or leading NOT searches its interval
  at construction; a trailing NOT holds the sequence until the watermark passes
  start + W (``release``).
- Window pruning drops instances older than (newest ts - W) from the bottom
  of the stacks; the pointers are absolute positions, so they stay valid.

Every loop over events, instances and candidates runs without the GIL.
"""
from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memmove

import numpy as np

from dqcep._kernels._alloc cimport grow
from dqcep._kernels._table cimport table_free, table_get, table_init, table_set
from dqcep._kernels._types cimport idx_t, ts_t
from dqcep._kernels.operators cimport PredicateSet
from dqcep._kernels.store cimport KIND_MISSING, EventStore, cell_hash

cdef enum:
    NEG_GAP = 0
    NEG_LEADING = 1
    NEG_TRAILING = 2
    MIN_STACK = 16

NEG_MODES = {"GAP": NEG_GAP, "LEADING": NEG_LEADING, "TRAILING": NEG_TRAILING}


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


cdef int _grow_rows(int64_t** buf, idx_t* cap, idx_t need, idx_t width) except -1 nogil:
    cdef idx_t c = cap[0] if cap[0] else 64
    while c < need:
        c *= 2
    if c == cap[0]:
        return 0
    buf[0] = <int64_t*>grow(buf[0], c * width * sizeof(int64_t))
    cap[0] = c
    return 0


# ---------------------------------------------------------------- the NFA

cdef class SaseNFA:
    """SaseNFA(window, state_types, neg_types, neg_modes, neg_after, key_attrs,
    scan_preds, build_preds, ranges)

    ``scan_preds``: predicates over one slot (checked with only that slot bound).
    ``build_preds`` in groups (``ranges[g]:ranges[g+1]``): g < n the predicates
    whose lowest slot is g (checked when construction binds slot g); g = n those
    checked on the complete sequence; g = n + 1 + j those of negation j, with
    the negated event in slot n + j.
    """

    def __cinit__(self):
        self.stacks = NULL
        self.negs = NULL
        self.held = NULL
        self.out_ids = NULL
        self.out_det = NULL
        self.rec = NULL
        self.tsb = NULL
        self.pos = NULL

    def __init__(self, int64_t window, state_types, neg_types, neg_modes, neg_after,
                 key_attrs, PredicateSet scan_preds, PredicateSet build_preds, ranges):
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
        if self.ranges[self.ranges.shape[0] - 1] != build_preds.n:
            raise ValueError("ranges do not cover build_preds")
        self.scan_preds, self.build_preds = scan_preds, build_preds
        self.has_trailing = False
        for i in range(self.m):
            if self.neg_mode[i] == NEG_TRAILING:
                self.has_trailing = True
        self.rec = <int64_t*>malloc((self.n + self.m) * sizeof(int64_t))
        self.tsb = <int64_t*>malloc(self.n * sizeof(int64_t))
        self.pos = <int64_t*>malloc(self.n * sizeof(int64_t))
        self.negs = <Stack*>malloc((self.m + 1) * sizeof(Stack))
        self.parts_cap = 4
        self.stacks = <Stack*>malloc(self.parts_cap * self.n * sizeof(Stack))
        if (self.rec == NULL or self.tsb == NULL or self.pos == NULL or self.negs == NULL
                or self.stacks == NULL):
            raise MemoryError()
        table_init(&self.part_of, 64)
        for i in range(self.m):
            self.negs[i] = Stack(NULL, NULL, NULL, 0, 0, 0, 0)
        self.n_parts = 0
        self.n_held = self.held_cap = self.n_out = self.out_cap = 0
        self.pushed = self.pruned = self.constructed = self.live = self.live_peak = 0

    def __dealloc__(self):
        cdef idx_t i
        if self.stacks != NULL:
            for i in range(self.n_parts * self.n):
                _stack_free(&self.stacks[i])
        if self.negs != NULL:
            for i in range(self.m):
                _stack_free(&self.negs[i])
        free(self.stacks)
        free(self.negs)
        table_free(&self.part_of)
        free(self.held)
        free(self.out_ids)
        free(self.out_det)
        free(self.rec)
        free(self.tsb)
        free(self.pos)

    # ------------------------------------------------------------ partitions
    cdef idx_t _partition(self, uint64_t key) except -1 nogil:
        """Index of the partition of ``key``, created (with empty stacks) if new."""
        cdef int64_t p = table_get(&self.part_of, <int64_t>key)
        cdef idx_t i
        if p >= 0:
            return <idx_t>p
        if self.n_parts == self.parts_cap:
            self.stacks = <Stack*>grow(self.stacks, 2 * self.parts_cap * self.n * sizeof(Stack))
            self.parts_cap *= 2
        p = self.n_parts
        for i in range(self.n):
            self.stacks[p * self.n + i] = Stack(NULL, NULL, NULL, 0, 0, 0, 0)
        self.n_parts += 1
        table_set(&self.part_of, <int64_t>key, p)
        return <idx_t>p

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
        cdef idx_t r = st.row(seq), j, s, a, part = -1, width = self.n + self.m
        cdef ts_t ts = st.ts[r]
        cdef uint64_t key = 0
        cdef Stack* prev
        cdef int64_t rip, dropped
        for j in range(self.m):
            if self.neg_type[j] != etype:
                continue
            for a in range(width):
                self.rec[a] = -1
            self.rec[self.n + j] = seq
            if self.scan_preds.holds(st, self.rec):
                _stack_push(&self.negs[j], seq, ts, -1)
        for s in range(self.n - 1, -1, -1):
            if self.state_type[s] != etype:
                continue
            for a in range(width):
                self.rec[a] = -1
            self.rec[s] = seq
            if not self.scan_preds.holds(st, self.rec):
                continue
            if part < 0:   # the event's partition, found once
                for a in range(self.key_attrs.shape[0]):
                    if st.kind[r * st.n_attrs + self.key_attrs[a]] == KIND_MISSING:
                        return 0   # [attr] needs the attribute: no state takes it
                    key = key * <uint64_t>0x100000001b3 ^ cell_hash(
                        st.kind[r * st.n_attrs + self.key_attrs[a]],
                        st.val[r * st.n_attrs + self.key_attrs[a]])
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
                self.live += 1
                if self.live > self.live_peak:
                    self.live_peak = self.live
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
        if not self.build_preds.holds_range(st, self.rec, self.ranges[n - 1],
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
            if not self.build_preds.holds_range(st, self.rec, self.ranges[k],
                                                self.ranges[k + 1]):
                continue
            if k == 0:
                self._complete(st)
                continue
            self.pos[k] = c                  # resumes below c when depth k - 1 is done
            k -= 1
            self.pos[k] = S.rip[c - S.offset]

    cdef int _complete(self, EventStore st) except -1 nogil:
        """A sequence is bound in rec: final predicates, negations, emit or hold."""
        cdef idx_t j, n = self.n
        cdef ts_t start = self.tsb[0], end = self.tsb[n - 1]
        self.constructed += 1
        if not self.build_preds.holds_range(st, self.rec, self.ranges[n], self.ranges[n + 1]):
            return 0
        for j in range(self.m):
            if self.neg_mode[j] == NEG_GAP:
                if self._violated(st, j, self.tsb[self.neg_after[j]], True,
                                  self.tsb[self.neg_after[j] + 1], True):
                    return 0
            elif self.neg_mode[j] == NEG_LEADING:
                if self._violated(st, j, end - self.window, False, start, True):
                    return 0
        if self.has_trailing:
            _grow_rows(&self.held, &self.held_cap, self.n_held + 1, n)
            for j in range(n):
                self.held[self.n_held * n + j] = self.rec[j]
            self.n_held += 1
            return 0
        return self._emit(st, end)

    cdef bint _violated(self, EventStore st, idx_t j, ts_t lo, bint lo_open, ts_t hi,
                        bint hi_open) noexcept nogil:
        """Is there an event of negation j in the interval that its conjuncts accept?"""
        cdef Stack* B = &self.negs[j]
        cdef int64_t p = _first_at_or_after(B, lo, lo_open)
        cdef ts_t t
        cdef idx_t g = self.n + 1 + j
        cdef bint found = False
        while p < B.hi:
            t = B.ts[p - B.offset]
            if t > hi or (hi_open and t == hi):
                break
            self.rec[self.n + j] = B.seq[p - B.offset]
            if self.build_preds.holds_range(st, self.rec, self.ranges[g], self.ranges[g + 1]):
                found = True
                break
            p += 1
        self.rec[self.n + j] = -1
        return found

    cdef int _emit(self, EventStore st, ts_t detected) except -1 nogil:
        cdef idx_t j, n = self.n, cap
        if self.n_out == self.out_cap:
            cap = self.out_cap
            _grow_rows(&self.out_det, &cap, self.n_out + 1, 1)
            _grow_rows(&self.out_ids, &self.out_cap, self.n_out + 1, n)
        for j in range(n):
            self.out_ids[self.n_out * n + j] = st.ids[st.row(self.rec[j])]
        self.out_det[self.n_out] = detected
        self.n_out += 1
        return 0

    # --------------------------------------------------- watermark, output
    def release(self, EventStore st, wm, bint everything=False):
        """Held sequences (trailing NOT) whose start + W < wm, or all: checked, emitted."""
        cdef idx_t i, j, kept = 0, n = self.n
        cdef ts_t start, mark = 0 if wm is None else <ts_t>wm
        cdef bint ok
        with nogil:
            for i in range(self.n_held):
                for j in range(n):
                    self.rec[j] = self.held[i * n + j]
                    self.tsb[j] = st.ts[st.row(self.rec[j])]
                for j in range(n, n + self.m):
                    self.rec[j] = -1
                start = self.tsb[0]
                if not everything and start + self.window >= mark:
                    for j in range(n):
                        self.held[kept * n + j] = self.rec[j]
                    kept += 1
                    continue
                ok = True
                for j in range(self.m):
                    if self.neg_mode[j] == NEG_TRAILING and self._violated(
                            st, j, self.tsb[n - 1], True, start + self.window, False):
                        ok = False
                        break
                if ok:
                    self._emit(st, start + self.window)
            self.n_held = kept

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

    def held_min_start(self, EventStore st):
        """Smallest start ts of a held sequence (None: none held)."""
        cdef idx_t i
        cdef ts_t best = 0, t
        if self.n_held == 0:
            return None
        for i in range(self.n_held):
            t = st.ts[st.row(self.held[i * self.n])]
            if i == 0 or t < best:
                best = t
        return best

    def take(self):
        """(detected_at int64[k], ids int64[k, n]) of the sequences emitted since the last take."""
        cdef idx_t k = self.n_out, n = self.n, i, j
        det = np.empty(k, dtype=np.int64)
        ids = np.empty((k, n), dtype=np.int64)
        cdef int64_t[::1] d = det
        cdef int64_t[:, ::1] o = ids
        for i in range(k):
            d[i] = self.out_det[i]
            for j in range(n):
                o[i, j] = self.out_ids[i * n + j]
        self.n_out = 0
        return det, ids

    @property
    def nbytes(self):
        """Bytes of the stacks, negation buffers, held and pending output."""
        cdef idx_t i
        cdef int64_t total = 0
        for i in range(self.n_parts * self.n):
            total += self.stacks[i].cap * 3 * sizeof(int64_t)
        for i in range(self.m):
            total += self.negs[i].cap * 3 * sizeof(int64_t)
        total += self.parts_cap * self.n * sizeof(Stack)
        total += (self.part_of.mask + 1) * sizeof(Int64Slot)
        total += self.held_cap * self.n * sizeof(int64_t)
        total += self.out_cap * (self.n + 1) * sizeof(int64_t)
        return total

    @property
    def instances(self):
        """Instances alive in the stacks now."""
        return self.live

    @property
    def partitions(self):
        return self.n_parts

    @property
    def held_count(self):
        return self.n_held
