"""The engine's event store and the predicate bytecode evaluator.

Every event that enters the engine is stored once, under a sequence number in
arrival order; partial-match records carry these numbers, not copies of events.
Rows live in a power-of-two ring (row = seq & mask) that doubles when full and
drops from the head as the watermark passes (input arrives in ts order, so the
head is always the oldest).

Attribute cells are (kind, float64): numbers as themselves, booleans as 0/1,
strings as codes of the engine's dictionary, so an attribute that is a number in
one event and a string in another still compares exactly as the spec says.

``eval_pred`` runs the plan's predicate bytecode (dqcep/plan/bytecode.py) over
the events of one record: numbers are binary64, and any failure — a missing
attribute, mismatched kinds, division by zero, a non-boolean result — makes the
predicate false.
"""
from libc.math cimport isnan
from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

import numpy as np

from dqcep._kernels._types cimport idx_t, ts_t

# The opcodes and cell kinds for Python (declared once, in store.pxd): the planner's
# bytecode (dqcep.plan.bytecode.Op) and the runtime's compiler import them from here.
OPCODES = {"CONST": OP_CONST, "LOAD": OP_LOAD, "EQUIV": OP_EQUIV, "NEG": OP_NEG,
           "NOT": OP_NOT, "ADD": OP_ADD, "SUB": OP_SUB, "MUL": OP_MUL, "DIV": OP_DIV,
           "EQ": OP_EQ, "NE": OP_NE, "LT": OP_LT, "LE": OP_LE, "GT": OP_GT, "GE": OP_GE,
           "AND": OP_AND, "OR": OP_OR, "AGG_COUNT": OP_AGG_COUNT, "AGG_SUM": OP_AGG_SUM,
           "AGG_AVG": OP_AGG_AVG, "AGG_MIN": OP_AGG_MIN, "AGG_MAX": OP_AGG_MAX}
KINDS = {"MISSING": KIND_MISSING, "NUM": KIND_NUM, "STR": KIND_STR, "BOOL": KIND_BOOL,
         "ATTR_TS": ATTR_TS, "ATTR_ID": ATTR_ID, "MAX_STACK": MAX_STACK}


cdef class EventStore:
    """EventStore(n_attrs)"""

    def __cinit__(self, idx_t n_attrs):
        self.ts = NULL
        self.ids = NULL
        self.val = NULL
        self.kind = NULL
        self.n_attrs = n_attrs
        self.base = 0
        self.next_seq = 0
        self.cap = 0
        self.mask = 0
        self.high_water = 0
        self._grow(1024)

    def __dealloc__(self):
        free(self.ts)
        free(self.ids)
        free(self.val)
        free(self.kind)

    cdef inline idx_t row(self, int64_t seq) noexcept nogil:
        return <idx_t>(seq & self.mask)

    cdef int _grow(self, idx_t need) except -1 nogil:
        cdef idx_t cap = self.cap if self.cap else 1024
        cdef idx_t na = self.n_attrs if self.n_attrs else 1
        cdef int64_t s
        cdef idx_t r_old, r_new
        while cap < need:
            cap *= 2
        if cap == self.cap:
            return 0
        cdef int64_t* ts = <int64_t*>malloc(cap * sizeof(int64_t))
        cdef int64_t* ids = <int64_t*>malloc(cap * sizeof(int64_t))
        cdef double* val = <double*>malloc(cap * na * sizeof(double))
        cdef int8_t* kind = <int8_t*>malloc(cap * na * sizeof(int8_t))
        if ts == NULL or ids == NULL or val == NULL or kind == NULL:
            free(ts)
            free(ids)
            free(val)
            free(kind)
            with gil:
                raise MemoryError(f"could not grow the event store to {cap} events")
        for s in range(self.base, self.next_seq):
            r_old = self.row(s)
            r_new = <idx_t>(s & (cap - 1))
            ts[r_new] = self.ts[r_old]
            ids[r_new] = self.ids[r_old]
            memcpy(&val[r_new * na], &self.val[r_old * na], na * sizeof(double))
            memcpy(&kind[r_new * na], &self.kind[r_old * na], na * sizeof(int8_t))
        free(self.ts)
        free(self.ids)
        free(self.val)
        free(self.kind)
        self.ts, self.ids, self.val, self.kind = ts, ids, val, kind
        self.cap, self.mask = cap, cap - 1
        return 0

    def append(self, const int64_t[::1] ts, const int64_t[::1] ids,
               const double[:, ::1] val, const int8_t[:, ::1] kind):
        """Store n events (in ts order); returns the sequence number of the first."""
        cdef idx_t n = ts.shape[0], i, a, r
        cdef idx_t na = self.n_attrs
        if ids.shape[0] != n or val.shape[0] != n or kind.shape[0] != n:
            raise ValueError("append: columns disagree in length")
        if n and na and (val.shape[1] != na or kind.shape[1] != na):
            raise ValueError(f"append: expected {na} attribute columns, got {val.shape[1]}")
        first = self.next_seq
        with nogil:
            self._grow(<idx_t>(self.next_seq - self.base) + n)
            for i in range(n):
                r = self.row(self.next_seq)
                self.ts[r] = ts[i]
                self.ids[r] = ids[i]
                for a in range(na):
                    self.val[r * na + a] = val[i, a]
                    self.kind[r * na + a] = kind[i, a]
                self.next_seq += 1
            if self.next_seq - self.base > self.high_water:
                self.high_water = self.next_seq - self.base
        return first

    def evict_before(self, ts_t cutoff):
        """Forget the oldest events with ts < cutoff; returns how many."""
        cdef int64_t start = self.base
        with nogil:
            while self.base < self.next_seq and self.ts[self.row(self.base)] < cutoff:
                self.base += 1
        return self.base - start

    def __len__(self):
        return self.next_seq - self.base

    @property
    def nbytes(self):
        return self.cap * (16 + (self.n_attrs or 1) * 9)

    def ts_of(self, const int64_t[::1] seqs):
        out = np.empty(seqs.shape[0], dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef idx_t i
        for i in range(seqs.shape[0]):
            self._check(seqs[i])
            o[i] = self.ts[self.row(seqs[i])]
        return out

    def ids_of(self, const int64_t[:, ::1] seqs):
        """User event ids for a 2-D array of sequence numbers (-1 stays -1)."""
        out = np.empty((seqs.shape[0], seqs.shape[1]), dtype=np.int64)
        cdef int64_t[:, ::1] o = out
        cdef idx_t i, j
        cdef int64_t s, bad = -1
        with nogil:
            for i in range(seqs.shape[0]):
                for j in range(seqs.shape[1]):
                    s = seqs[i, j]
                    if s < 0:
                        o[i, j] = -1
                    elif s < self.base or s >= self.next_seq:
                        bad = s
                    else:
                        o[i, j] = self.ids[self.row(s)]
        if bad >= 0:
            self._check(bad)
        return out

    def cell(self, int64_t seq, idx_t a):
        """(kind, value) of attribute column a of an event (tests, snapshot)."""
        self._check(seq)
        cdef idx_t r = self.row(seq)
        return (self.kind[r * self.n_attrs + a], self.val[r * self.n_attrs + a])

    def _check(self, int64_t seq):
        if seq < self.base or seq >= self.next_seq:
            raise IndexError(f"event {seq} is not in the store ({self.base}..{self.next_seq - 1})")

    def dump(self):
        """The stored events as arrays (ts, ids, val[n, a], kind[n, a]), oldest first."""
        cdef idx_t n = <idx_t>(self.next_seq - self.base), i
        seqs = np.arange(self.base, self.next_seq, dtype=np.int64)
        ts = np.empty(n, np.int64)
        ids = np.empty(n, np.int64)
        val = np.empty((n, self.n_attrs), np.float64)
        kind = np.empty((n, self.n_attrs), np.int8)
        for i in range(n):
            r = self.row(self.base + i)
            ts[i] = self.ts[r]
            ids[i] = self.ids[r]
            for a in range(self.n_attrs):
                val[i, a] = self.val[r * self.n_attrs + a]
                kind[i, a] = self.kind[r * self.n_attrs + a]
        return seqs, ts, ids, val, kind

    def string_codes(self):
        """Dictionary codes of the retained events' string cells (repeats included):
        what of the engine's string dictionary the store still refers to."""
        cdef idx_t n = <idx_t>(self.next_seq - self.base), na = self.n_attrs, i, a, r, k = 0
        out = np.empty(n * na, np.int64)
        cdef int64_t[::1] o = out
        with nogil:
            for i in range(n):
                r = self.row(self.base + i)
                for a in range(na):
                    if self.kind[r * na + a] == KIND_STR:
                        o[k] = <int64_t>self.val[r * na + a]
                        k += 1
        return out[:k]

    def load(self, int64_t base, ts, ids, val, kind):
        """Replace the contents by a dump (restore); the first event gets seq ``base``."""
        self.base = base
        self.next_seq = base
        self.append(np.ascontiguousarray(ts, np.int64), np.ascontiguousarray(ids, np.int64),
                    np.ascontiguousarray(val, np.float64).reshape(len(ts), self.n_attrs),
                    np.ascontiguousarray(kind, np.int8).reshape(len(ts), self.n_attrs))


cdef inline bint _load(EventStore st, int64_t seq, int32_t attr, int8_t* k, double* v) noexcept nogil:
    cdef idx_t r
    if seq < 0:
        return False
    r = st.row(seq)
    if attr == ATTR_TS:
        k[0] = KIND_NUM
        v[0] = <double>st.ts[r]
    elif attr == ATTR_ID:
        k[0] = KIND_NUM
        v[0] = <double>st.ids[r]
    else:
        k[0] = st.kind[r * st.n_attrs + attr]
        v[0] = st.val[r * st.n_attrs + attr]
    return k[0] != KIND_MISSING


cdef bint eval_pred(EventStore st, const int32_t* code, idx_t n_ins, const double* cval,
                    const int8_t* ckind, const int64_t* slots) noexcept nogil:
    """Evaluate one compiled conjunct over a record's events (slots -> seq numbers)."""
    return eval_pred_aggs(st, code, n_ins, cval, ckind, slots, NULL, NULL)


cdef bint eval_pred_aggs(EventStore st, const int32_t* code, idx_t n_ins,
                         const double* cval, const int8_t* ckind, const int64_t* slots,
                         const double* aggv, const int8_t* aggk) noexcept nogil:
    """``eval_pred`` with the values of its aggregate instructions given, in order."""
    cdef int8_t sk[MAX_STACK]
    cdef double sv[MAX_STACK]
    cdef idx_t sp = 0, i, s, n_agg = 0
    cdef int32_t op, a, b
    cdef int8_t k0, k1
    cdef double v0, v1
    cdef bint first, equal
    for i in range(n_ins):
        op, a, b = code[3 * i], code[3 * i + 1], code[3 * i + 2]
        if op >= OP_AGG_COUNT:
            if aggk == NULL or aggk[n_agg] != KIND_NUM:
                return False
            sk[sp] = KIND_NUM
            sv[sp] = aggv[n_agg]
            n_agg += 1
            sp += 1
        elif op == OP_CONST:
            sk[sp] = ckind[a]
            sv[sp] = cval[a]
            sp += 1
        elif op == OP_LOAD:
            if not _load(st, slots[a], b, &sk[sp], &sv[sp]):
                return False
            sp += 1
        elif op == OP_EQUIV:
            first, equal = True, True
            for s in range(b):
                if slots[s] < 0:
                    continue
                if not _load(st, slots[s], a, &k1, &v1):
                    return False
                if first:
                    k0, v0, first = k1, v1, False
                elif k1 != k0:
                    return False            # values of different types: fails
                elif v1 != v0:
                    equal = False
            sk[sp] = KIND_BOOL
            sv[sp] = 1.0 if equal else 0.0
            sp += 1
        elif op == OP_NEG:
            if sk[sp - 1] != KIND_NUM:
                return False
            sv[sp - 1] = -sv[sp - 1]
        elif op == OP_NOT:
            if sk[sp - 1] != KIND_BOOL:
                return False
            sv[sp - 1] = 0.0 if sv[sp - 1] != 0.0 else 1.0
        else:
            sp -= 1
            k1, v1 = sk[sp], sv[sp]
            k0, v0 = sk[sp - 1], sv[sp - 1]
            if op == OP_AND or op == OP_OR:
                if k0 != KIND_BOOL or k1 != KIND_BOOL:
                    return False
                sv[sp - 1] = (1.0 if (v0 != 0.0 and v1 != 0.0) else 0.0) if op == OP_AND \
                    else (1.0 if (v0 != 0.0 or v1 != 0.0) else 0.0)
            elif op == OP_EQ or op == OP_NE:
                if k0 != k1:
                    return False
                sk[sp - 1] = KIND_BOOL
                sv[sp - 1] = 1.0 if ((v0 == v1) == (op == OP_EQ)) else 0.0
            else:
                if k0 != KIND_NUM or k1 != KIND_NUM:
                    return False
                if op == OP_ADD:
                    sv[sp - 1] = v0 + v1
                elif op == OP_SUB:
                    sv[sp - 1] = v0 - v1
                elif op == OP_MUL:
                    sv[sp - 1] = v0 * v1
                elif op == OP_DIV:
                    if v1 == 0.0:
                        return False
                    sv[sp - 1] = v0 / v1
                else:
                    sk[sp - 1] = KIND_BOOL
                    if op == OP_LT:
                        sv[sp - 1] = 1.0 if v0 < v1 else 0.0
                    elif op == OP_LE:
                        sv[sp - 1] = 1.0 if v0 <= v1 else 0.0
                    elif op == OP_GT:
                        sv[sp - 1] = 1.0 if v0 > v1 else 0.0
                    else:
                        sv[sp - 1] = 1.0 if v0 >= v1 else 0.0
    return sp == 1 and sk[0] == KIND_BOOL and sv[0] != 0.0


cdef uint64_t cell_hash(int8_t kind, double v) noexcept nogil:
    """Hash of one attribute value for the partition key (-0.0 and 0.0 are equal)."""
    cdef uint64_t bits
    if v == 0.0:
        v = 0.0
    memcpy(&bits, &v, 8)
    bits ^= (<uint64_t>kind) * <uint64_t>0x9e3779b97f4a7c15
    bits ^= bits >> 33
    bits *= <uint64_t>0xff51afd7ed558ccd
    bits ^= bits >> 33
    return bits


def py_eval(EventStore st, const int32_t[:, ::1] code, const double[::1] cval,
            const int8_t[::1] ckind, const int64_t[::1] slots):
    """Evaluate one predicate on one record (tests)."""
    return bool(eval_pred(st, &code[0, 0], code.shape[0],
                          &cval[0] if cval.shape[0] else NULL,
                          &ckind[0] if ckind.shape[0] else NULL, &slots[0]))
