"""Kleene lists and the iteration operator (spec 5.1), without the GIL.

``ListStore``: every list an engine makes, once. A list is a *node*: its last
element, a pointer to the list without that element (its prefix, itself a node)
and what is kept incrementally: the count, the first element, start and end ts,
and per aggregated attribute column the sum, min and max and whether every
element holds a number there. Under skip-till-any-match the lists of a run of
events share their prefixes, so a list costs one node, as a stack entry of
SASE. Handles count every node ever appended; nodes leave from the oldest as the
watermark passes their end (``evict_end_before``): a record that holds a list
keeps it at most the store's retention.

``kleene_step``: the KLEENE vertex over one batch of its events (in ts order):
each event starts a list of its own and extends every list of its key that ends
strictly before it and starts within the window, where the conditions on an
element and the one before (or the first) hold. Events with equal ts never
extend each other. Every new list joins the vertex's queue of lists that may
grow; those that pass the whole-list conditions are the vertex's output.
"""
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t
from libc.stdlib cimport free
from libc.string cimport memmove

import numpy as np

from dqcep._kernels._alloc cimport grow
from dqcep._kernels._types cimport idx_t, ts_t
from dqcep._kernels.operators cimport PredicateSet
from dqcep._kernels.ring cimport (COL_END, COL_IDS, COL_KEY, COL_START, KeyedQueue, RingBuffer,
                                  kq_at, kq_older, ring_push)
from dqcep._kernels.store cimport (ATTR_ID, ATTR_TS, KIND_MISSING, KIND_NUM, OP_AGG_AVG,
                                   OP_AGG_COUNT, OP_AGG_MIN, OP_AGG_SUM, EventStore,
                                   eval_pred_aggs)

cdef enum:
    MIN_NODES = 64


cdef inline bint _number(EventStore st, int64_t seq, int32_t col, double* out) noexcept nogil:
    """The element's value in an aggregated column, if it is a number."""
    cdef idx_t r = st.row(seq)
    if col == ATTR_TS:
        out[0] = <double>st.ts[r]
        return True
    if col == ATTR_ID:
        out[0] = <double>st.ids[r]
        return True
    if st.kind[r * st.n_attrs + col] != KIND_NUM:
        return False
    out[0] = st.val[r * st.n_attrs + col]
    return True


cdef class ListStore:
    """ListStore(agg_attrs=())

    Lists as nodes (see the module docstring); ``agg_attrs``: the store columns
    whose sum, min and max each node keeps.
    """

    def __cinit__(self, agg_attrs=()):
        self.seq = self.parent = self.count = self.first = self.start = self.end = NULL
        self.agg = NULL
        self.ok = NULL
        self.agg_attr = NULL
        cols = np.ascontiguousarray(agg_attrs, dtype=np.int32)
        self.n_aggs = cols.shape[0]
        self.agg_attr = <int32_t*>grow(NULL, max(self.n_aggs, 1) * sizeof(int32_t))
        cdef idx_t k
        for k in range(self.n_aggs):
            self.agg_attr[k] = cols[k]
        self.evicted = self.offset = 0
        self.size = self.cap = self.high_water = 0
        self._reserve(MIN_NODES)

    def __dealloc__(self):
        free(self.seq)
        free(self.parent)
        free(self.count)
        free(self.first)
        free(self.start)
        free(self.end)
        free(self.agg)
        free(self.ok)
        free(self.agg_attr)

    cdef int _reserve(self, idx_t extra) except -1 nogil:
        """Room for ``extra`` more nodes: the evicted rows at the front are dropped
        first (a move), the arrays grow only when the kept nodes need it."""
        cdef idx_t dead = <idx_t>(self.evicted - self.offset), cap, k, w = self.n_aggs
        if (self.evicted - self.offset) + self.size + extra <= self.cap:
            return 0
        if dead:
            memmove(self.seq, self.seq + dead, self.size * sizeof(int64_t))
            memmove(self.parent, self.parent + dead, self.size * sizeof(int64_t))
            memmove(self.count, self.count + dead, self.size * sizeof(int64_t))
            memmove(self.first, self.first + dead, self.size * sizeof(int64_t))
            memmove(self.start, self.start + dead, self.size * sizeof(int64_t))
            memmove(self.end, self.end + dead, self.size * sizeof(int64_t))
            if w:
                memmove(self.agg, self.agg + 3 * w * dead, 3 * w * self.size * sizeof(double))
                memmove(self.ok, self.ok + w * dead, w * self.size * sizeof(uint8_t))
            self.offset = self.evicted
        if self.size + extra <= self.cap:
            return 0
        cap = self.cap if self.cap else MIN_NODES
        while cap < self.size + extra:
            cap *= 2
        self.seq = <int64_t*>grow(self.seq, cap * sizeof(int64_t))
        self.parent = <int64_t*>grow(self.parent, cap * sizeof(int64_t))
        self.count = <int64_t*>grow(self.count, cap * sizeof(int64_t))
        self.first = <int64_t*>grow(self.first, cap * sizeof(int64_t))
        self.start = <int64_t*>grow(self.start, cap * sizeof(int64_t))
        self.end = <int64_t*>grow(self.end, cap * sizeof(int64_t))
        self.agg = <double*>grow(self.agg, max(3 * w * cap, 1) * sizeof(double))
        self.ok = <uint8_t*>grow(self.ok, max(w * cap, 1) * sizeof(uint8_t))
        self.cap = cap
        return 0

    cdef int64_t append(self, EventStore st, int64_t parent, int64_t seq) except -1 nogil:
        """The list ``parent`` (-1: none) with event ``seq`` appended; its handle."""
        cdef idx_t r, p = 0, k, w = self.n_aggs
        cdef double v = 0.0
        cdef bint has
        self._reserve(1)
        r = <idx_t>(self.evicted - self.offset) + self.size
        self.seq[r] = seq
        self.parent[r] = parent
        self.end[r] = st.ts[st.row(seq)]
        if parent < 0:
            self.count[r] = 1
            self.first[r] = seq
            self.start[r] = self.end[r]
        else:
            p = ls_row(self, parent)
            self.count[r] = self.count[p] + 1
            self.first[r] = self.first[p]
            self.start[r] = self.start[p]
        for k in range(w):
            has = _number(st, seq, self.agg_attr[k], &v)
            if parent < 0:
                self.ok[r * w + k] = has
                self.agg[3 * (r * w + k)] = v if has else 0.0
                self.agg[3 * (r * w + k) + 1] = v if has else 0.0
                self.agg[3 * (r * w + k) + 2] = v if has else 0.0
            else:
                self.ok[r * w + k] = has and self.ok[p * w + k]
                if self.ok[r * w + k]:  # in ts order, as every engine sums
                    self.agg[3 * (r * w + k)] = self.agg[3 * (p * w + k)] + v
                    self.agg[3 * (r * w + k) + 1] = min(self.agg[3 * (p * w + k) + 1], v)
                    self.agg[3 * (r * w + k) + 2] = max(self.agg[3 * (p * w + k) + 2], v)
        self.size += 1
        if self.size > self.high_water:
            self.high_water = self.size
        return self.evicted + self.size - 1

    cdef idx_t evict_end_before(self, ts_t cutoff) noexcept nogil:
        """Drop the oldest nodes while their list ends before ``cutoff``."""
        cdef idx_t n = 0
        while self.size and self.end[ls_row(self, self.evicted)] < cutoff:
            self.evicted += 1
            self.size -= 1
            n += 1
        return n

    # ------------------------------------------------------------ Python API

    def py_append(self, EventStore st, int64_t parent, int64_t seq) -> int:
        self._check(parent, True)
        return self.append(st, parent, seq)

    def py_evict_end_before(self, ts_t cutoff) -> int:
        return self.evict_end_before(cutoff)

    def _check(self, int64_t handle, bint allow_none=False):
        if allow_none and handle == -1:
            return
        if not self.evicted <= handle < self.evicted + self.size:
            raise IndexError(f"list {handle} is not kept (kept: {self.evicted}.."
                             f"{self.evicted + self.size - 1})")

    def info(self, int64_t handle) -> dict:
        """count, first (seq), start, end of a list."""
        self._check(handle)
        cdef idx_t r = ls_row(self, handle)
        return {"count": self.count[r], "first": self.first[r], "start": self.start[r],
                "end": self.end[r], "last": self.seq[r], "parent": self.parent[r]}

    def elements(self, int64_t handle) -> np.ndarray:
        """The list's event sequence numbers, in ts order."""
        self._check(handle)
        cdef idx_t r = ls_row(self, handle), n = self.count[r], i
        out = np.empty(n, np.int64)
        cdef int64_t[::1] o = out
        cdef int64_t h = handle
        for i in range(n - 1, -1, -1):
            o[i] = self.seq[ls_row(self, h)]
            h = self.parent[ls_row(self, h)]
        return out

    def aggregate(self, int64_t handle, idx_t k, str func):
        """count / sum / avg / min / max of aggregated column k; None when an element
        lacks a number there."""
        self._check(handle)
        cdef idx_t r = ls_row(self, handle), w = self.n_aggs
        if func == "count":
            return int(self.count[r])
        if not 0 <= k < w:
            raise IndexError(f"aggregate column {k} of {w}")
        if not self.ok[r * w + k]:
            return None
        total = self.agg[3 * (r * w + k)]
        return {"sum": total, "avg": total / self.count[r], "min": self.agg[3 * (r * w + k) + 1],
                "max": self.agg[3 * (r * w + k) + 2]}[func]

    @property
    def nbytes(self) -> int:
        """Bytes held by the kept nodes."""
        return self.size * (6 * 8 + self.n_aggs * (3 * 8 + 1))


cdef bint holds_with_lists(PredicateSet ps, EventStore st, const int64_t* rec,
                           ListStore ls, const int64_t* list_of_slot) noexcept nogil:
    """``ps.holds(st, rec)`` where aggregate instructions read the lists: the list in
    slot s of the record is ``list_of_slot[s]`` (a handle; -1: not a list)."""
    cdef idx_t p, i, j, k, r, w = ls.n_aggs, n
    cdef int32_t op, a, b
    cdef double aggv[64]
    cdef int8_t aggk[64]
    cdef bint bound
    for p in range(ps.n):
        bound = True
        for j in range(ps.slot_start[p], ps.slot_start[p + 1]):
            if rec[ps.slots[j]] < 0:
                bound = False
                break
        if not bound:
            continue
        n = 0
        for i in range(ps.pred_start[p], ps.pred_start[p + 1]):
            op, a, b = ps.code[i, 0], ps.code[i, 1], ps.code[i, 2]
            if op < OP_AGG_COUNT:
                continue
            if n == 64:
                return False  # more aggregates than one condition can hold: refused at build
            aggk[n] = KIND_MISSING
            if list_of_slot[a] >= 0:
                r = ls_row(ls, list_of_slot[a])
                if op == OP_AGG_COUNT:
                    aggk[n], aggv[n] = KIND_NUM, <double>ls.count[r]
                else:
                    for k in range(w):
                        if ls.agg_attr[k] == b:
                            if ls.ok[r * w + k]:
                                aggk[n] = KIND_NUM
                                if op == OP_AGG_SUM:
                                    aggv[n] = ls.agg[3 * (r * w + k)]
                                elif op == OP_AGG_AVG:
                                    aggv[n] = ls.agg[3 * (r * w + k)] / ls.count[r]
                                elif op == OP_AGG_MIN:
                                    aggv[n] = ls.agg[3 * (r * w + k) + 1]
                                else:
                                    aggv[n] = ls.agg[3 * (r * w + k) + 2]
                            break
            n += 1
        if not eval_pred_aggs(st, &ps.code[ps.pred_start[p], 0],
                              ps.pred_start[p + 1] - ps.pred_start[p],
                              &ps.cval[0] if ps.cval.shape[0] else NULL,
                              &ps.ckind[0] if ps.ckind.shape[0] else NULL, rec, aggv, aggk):
            return False
    return True


cdef bint _whole(ListStore lists, EventStore st, int64_t h, PredicateSet whole,
                 PredicateSet whole_each, PredicateSet whole_pairs) noexcept nogil:
    """The whole-list conditions on list h: ``whole`` once on [last element, -, first];
    ``whole_each`` on every element, ``whole_pairs`` on every element from the second
    on with the one before (both read aggregates of the complete list too)."""
    cdef idx_t r = ls_row(lists, h)
    cdef int64_t rec[3]
    cdef int64_t handles[3]
    cdef int64_t node = h, parent
    handles[0], handles[1], handles[2] = h, -1, -1  # aggregates read the list in slot 0
    rec[0], rec[1], rec[2] = lists.seq[r], -1, lists.first[r]
    if not holds_with_lists(whole, st, rec, lists, handles):
        return False
    if whole_each.n == 0 and whole_pairs.n == 0:
        return True
    while node >= 0:  # from the last element back to the first
        parent = lists.parent[ls_row(lists, node)]
        rec[0] = lists.seq[ls_row(lists, node)]
        rec[1] = -1
        if not holds_with_lists(whole_each, st, rec, lists, handles):
            return False
        if parent >= 0:
            rec[1] = lists.seq[ls_row(lists, parent)]
            if not holds_with_lists(whole_pairs, st, rec, lists, handles):
                return False
        node = parent
    return True


cdef inline int _made(ListStore lists, KeyedQueue growing, EventStore st, int64_t h,
                      int64_t key, PredicateSet whole, PredicateSet whole_each,
                      PredicateSet whole_pairs, RingBuffer out) except -1 nogil:
    """A new list: it may grow (``growing``); it goes out if the whole-list conditions
    hold (``_whole``)."""
    cdef idx_t r = ls_row(lists, h)
    cdef int64_t* o
    growing.append(lists.start[r], lists.end[r], key, &h)
    if _whole(lists, st, h, whole, whole_each, whole_pairs):
        o = ring_push(out)
        o[COL_START] = lists.start[r]
        o[COL_END] = lists.end[r]
        o[COL_KEY] = key
        o[COL_IDS] = h
    return 0


def kleene_step(ListStore lists, EventStore st, KeyedQueue growing, int64_t window,
                const int64_t[::1] seqs, const int64_t[::1] ts, const int64_t[::1] keys,
                PredicateSet pairs, PredicateSet first, PredicateSet whole,
                PredicateSet whole_each, PredicateSet whole_pairs, RingBuffer out):
    """One batch of a KLEENE vertex's events (``seqs``, ``ts`` ascending, ``keys``).

    ``growing``: the vertex's lists that may still grow (one id: the list handle),
    by end ts with per-key chains. Conditions are checked on the record
    [element, element before, first element]: ``pairs`` when an element is
    appended to a list (never on a one-element list), ``first`` on each one-element
    list, the whole-list ones (``whole``, ``whole_each``, ``whole_pairs``: see
    ``_whole``) on every list made, which then goes to ``out`` (one id: the
    handle). A list made at ts t ends at t, so no other event of ts t extends it.
    Returns the number of lists made."""
    cdef idx_t n = seqs.shape[0], j
    cdef int64_t made = 0, pos, h
    cdef int64_t rec[3]
    cdef int64_t* row
    if ts.shape[0] != n or keys.shape[0] != n:
        raise ValueError("seqs, ts and keys must have one entry per event")
    if growing.n_ids != 1 or out.n_ids != 1:
        raise ValueError("list records hold one id: the list's handle")
    with nogil:
        for j in range(n):
            pos = growing.newest_with_key(keys[j])  # before this event's own lists
            rec[0] = seqs[j]
            rec[1] = -1
            rec[2] = seqs[j]
            if first.holds(st, rec):
                _made(lists, growing, st, lists.append(st, -1, seqs[j]), keys[j], whole,
                      whole_each, whole_pairs, out)
                made += 1
            while pos >= 0:
                row = kq_at(growing, pos)
                if row[COL_END] < ts[j] - window:
                    break  # older lists end before the window: none starts in it
                if row[COL_START] >= ts[j] - window and row[COL_END] < ts[j]:
                    h = row[COL_IDS]
                    rec[1] = lists.seq[ls_row(lists, h)]
                    rec[2] = lists.first[ls_row(lists, h)]
                    if pairs.holds(st, rec):
                        _made(lists, growing, st, lists.append(st, h, seqs[j]), keys[j],
                              whole, whole_each, whole_pairs, out)
                        made += 1
                pos = kq_older(growing, pos)
    return made
