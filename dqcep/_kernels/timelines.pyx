"""The largest ts per timeline (spec section 7), beside the reorder buffer.

With ``--timeline K``, the events that carry ``K`` with the same value share a timeline
(the value itself: the number 1, the string '1' and true are three), those without ``K``
share one more (and without ``K`` every event is on that one). ``admit`` applies the
late rule to a batch in arrival order, event by event, as the spec writes it: T(k) and
G are the largest ts of the events admitted before (G: and of the ticks), so the reason
an event is late (its own timeline, or the skew across them) is the spec's.

A timeline whose T(k) - L is at most G - D says nothing the skew test does not say, and
never will again (G never falls): ``forget_at_most(G - D + L)`` drops such timelines, so
the table holds the timelines heard from in the last D - L ms, not every device ever
seen. Numbers key a hash table by their bits (-0.0 as 0.0), strings another by their
dictionary code (the engine keeps those codes alive: ``string_codes``); booleans and the
missing value have a slot each. No Python object per event.
"""
from libc.stdint cimport int8_t, int64_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy

import numpy as np

from dqcep._kernels._table cimport Int64Table, table_free, table_get, table_init, table_set
from dqcep._kernels._types cimport idx_t, ts_t
from dqcep._kernels.store cimport KIND_BOOL, KIND_MISSING, KIND_NUM, KIND_STR

cdef ts_t NO_BOUND = -0x7fffffffffffffff - 1


cdef inline int64_t num_key(double v) noexcept nogil:
    cdef int64_t bits
    if v == 0.0:
        v = 0.0
    memcpy(&bits, &v, 8)
    return bits


cdef inline bint behind(ts_t before, ts_t ts, ts_t lim) noexcept nogil:
    """ts < before - lim, exactly (no overflow: before - ts taken as uint64)."""
    return before > ts and <uint64_t>(before - ts) > <uint64_t>lim


cdef class Timelines:
    """Timelines(): no timeline yet."""

    cdef Int64Table nums      # number bits -> entry
    cdef Int64Table strs      # string code -> entry
    cdef int64_t fixed[3]     # entry of: missing, false, true (-1: none)
    cdef int8_t* kinds        # per entry: its value's kind ...
    cdef double* vals         # ... and value (string: code) ...
    cdef ts_t* tmax           # ... and T(k)
    cdef idx_t n, cap

    def __cinit__(self):
        table_init(&self.nums, 16)
        table_init(&self.strs, 16)
        self.fixed[0] = self.fixed[1] = self.fixed[2] = -1
        self.kinds, self.vals, self.tmax, self.n, self.cap = NULL, NULL, NULL, 0, 0

    def __dealloc__(self):
        table_free(&self.nums)
        table_free(&self.strs)
        free(self.kinds)
        free(self.vals)
        free(self.tmax)

    cdef int grow(self) except -1 nogil:
        cdef idx_t cap = 64 if self.cap == 0 else 2 * self.cap
        cdef int8_t* k = <int8_t*>realloc(self.kinds, cap * sizeof(int8_t))
        if k != NULL:
            self.kinds = k
        cdef double* v = <double*>realloc(self.vals, cap * sizeof(double))
        if v != NULL:
            self.vals = v
        cdef ts_t* t = <ts_t*>realloc(self.tmax, cap * sizeof(ts_t))
        if t != NULL:
            self.tmax = t
        if k == NULL or v == NULL or t == NULL:
            with gil:
                raise MemoryError(f"could not allocate {cap} timelines")
        self.cap = cap
        return 0

    cdef idx_t entry(self, int8_t kind, double v) except -1 nogil:
        """The entry of the timeline of value (kind, v), made if new (T: no bound)."""
        cdef int64_t e, key = 0
        cdef int slot = -1
        if kind == KIND_NUM:
            key = num_key(v)
            e = table_get(&self.nums, key)
        elif kind == KIND_STR:
            key = <int64_t>v
            e = table_get(&self.strs, key)
        else:
            slot = 0 if kind == KIND_MISSING else (2 if v != 0.0 else 1)
            e = self.fixed[slot]
        if e >= 0:
            return e
        if self.n == self.cap:
            self.grow()
        e = self.n
        self.kinds[e], self.tmax[e] = kind, NO_BOUND
        self.vals[e] = 0.0 if kind == KIND_MISSING else (v if kind != KIND_NUM or v != 0.0 else 0.0)
        self.n += 1
        if kind == KIND_NUM:
            table_set(&self.nums, key, e)
        elif kind == KIND_STR:
            table_set(&self.strs, key, e)
        else:
            self.fixed[slot] = e
        return e

    def admit(self, const int8_t[::1] kind, const double[::1] val, const int64_t[::1] ts,
              ts_t g, ts_t lateness, ts_t skew, ts_t floor):
        """Spec section 7's admission of a batch in arrival order: (why, G after it).

        ``why[i]``: 0 admitted, 1 late on its timeline (ts < T(k) - L), 2 late by the
        skew (ts < G - D, or below ``floor``, an explicit watermark). ``g``: G before
        the batch (INT64_MIN: none; ticks included). Empty ``kind`` and ``val``: one
        timeline (no ``--timeline``). T(k) and G take the admitted events only."""
        cdef idx_t i, e, n = ts.shape[0]
        cdef bint one = kind.shape[0] == 0
        out = np.zeros(n, dtype=np.int8)
        cdef int8_t[::1] why = out
        with nogil:
            for i in range(n):
                e = self.entry(KIND_MISSING if one else kind[i], 0.0 if one else val[i])
                if behind(self.tmax[e], ts[i], lateness):
                    why[i] = 1
                elif behind(g, ts[i], skew) or ts[i] < floor:
                    why[i] = 2
                else:
                    if ts[i] > self.tmax[e]:
                        self.tmax[e] = ts[i]
                    if ts[i] > g:
                        g = ts[i]
        return out, g

    def add(self, const int8_t[::1] kind, const double[::1] val, const int64_t[::1] tmax):
        """Take timelines in (a snapshot's ``arrays()``): T(k) = max(T(k), tmax)."""
        cdef idx_t i, e
        with nogil:
            for i in range(tmax.shape[0]):
                e = self.entry(kind[i], val[i])
                if tmax[i] > self.tmax[e]:
                    self.tmax[e] = tmax[i]

    def forget_at_most(self, ts_t bound):
        """Drop the timelines with T(k) <= ``bound``; returns how many were dropped."""
        cdef idx_t i, kept = 0, dropped
        cdef int s
        with nogil:
            for i in range(self.n):
                if self.tmax[i] > bound:
                    self.kinds[kept], self.vals[kept], self.tmax[kept] = \
                        self.kinds[i], self.vals[i], self.tmax[i]
                    kept += 1
            dropped = self.n - kept
            if dropped:
                table_free(&self.nums)
                table_free(&self.strs)
                table_init(&self.nums, 2 * kept)
                table_init(&self.strs, 2 * kept)
                for s in range(3):
                    self.fixed[s] = -1
                self.n = kept
                for i in range(kept):
                    if self.kinds[i] == KIND_NUM:
                        table_set(&self.nums, num_key(self.vals[i]), i)
                    elif self.kinds[i] == KIND_STR:
                        table_set(&self.strs, <int64_t>self.vals[i], i)
                    elif self.kinds[i] == KIND_MISSING:
                        self.fixed[0] = i
                    else:
                        self.fixed[2 if self.vals[i] != 0.0 else 1] = i
        return dropped

    def arrays(self):
        """(kinds int8, values float64, T int64) of every timeline, in entry order."""
        kinds = np.empty(self.n, dtype=np.int8)
        vals = np.empty(self.n, dtype=np.float64)
        tmax = np.empty(self.n, dtype=np.int64)
        cdef int8_t[::1] k = kinds
        cdef double[::1] v = vals
        cdef int64_t[::1] t = tmax
        cdef idx_t i
        for i in range(self.n):
            k[i], v[i], t[i] = self.kinds[i], self.vals[i], self.tmax[i]
        return kinds, vals, tmax

    def string_codes(self):
        """The dictionary codes of the string-valued timelines (live codes)."""
        kinds, vals, _ = self.arrays()
        return vals[kinds == KIND_STR].astype(np.int64)

    def __len__(self):
        return self.n

    def __reduce__(self):
        return _restored, self.arrays()


def _restored(kinds, vals, tmax):
    t = Timelines()
    t.add(kinds, vals, tmax)
    return t
