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
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memmove

import numpy as np

from dqcep._kernels._alloc cimport grow
from dqcep._kernels._types cimport idx_t, ts_t

cdef enum:
    MIN_NODES = 64  # nodes a ListStore allocates first

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
        self.type_code = NULL
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
        free(self.type_code)
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
        cdef int32_t* type_ = <int32_t*>malloc(cap * sizeof(int32_t))
        cdef double* val = <double*>malloc(cap * na * sizeof(double))
        cdef int8_t* kind = <int8_t*>malloc(cap * na * sizeof(int8_t))
        if ts == NULL or ids == NULL or type_ == NULL or val == NULL or kind == NULL:
            free(ts)
            free(ids)
            free(type_)
            free(val)
            free(kind)
            with gil:
                raise MemoryError(f"could not grow the event store to {cap} events")
        for s in range(self.base, self.next_seq):
            r_old = self.row(s)
            r_new = <idx_t>(s & (cap - 1))
            ts[r_new] = self.ts[r_old]
            ids[r_new] = self.ids[r_old]
            type_[r_new] = self.type_code[r_old]
            memcpy(&val[r_new * na], &self.val[r_old * na], na * sizeof(double))
            memcpy(&kind[r_new * na], &self.kind[r_old * na], na * sizeof(int8_t))
        free(self.ts)
        free(self.ids)
        free(self.type_code)
        free(self.val)
        free(self.kind)
        self.ts, self.ids, self.type_code, self.val, self.kind = ts, ids, type_, val, kind
        self.cap, self.mask = cap, cap - 1
        return 0

    def append(self, const int64_t[::1] ts, const int64_t[::1] ids,
               const double[:, ::1] val, const int8_t[:, ::1] kind,
               const int32_t[::1] types=None):
        """Store n events (in ts order); returns the sequence number of the first.
        ``types``: their type codes (None: -1, unknown), which a replay of the stored
        events reads (``types_of``)."""
        cdef idx_t n = ts.shape[0], i, a, r
        cdef idx_t na = self.n_attrs
        cdef bint typed = types is not None
        if ids.shape[0] != n or val.shape[0] != n or kind.shape[0] != n or \
                (typed and types.shape[0] != n):
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
                self.type_code[r] = types[i] if typed else -1
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
        return self.cap * (20 + (self.n_attrs or 1) * 9)

    def ts_of(self, const int64_t[::1] seqs):
        out = np.empty(seqs.shape[0], dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef idx_t i
        for i in range(seqs.shape[0]):
            self._check(seqs[i])
            o[i] = self.ts[self.row(seqs[i])]
        return out

    def types_of(self, const int64_t[::1] seqs):
        """The type codes the events were stored with (-1: not given)."""
        out = np.empty(seqs.shape[0], dtype=np.int32)
        cdef int32_t[::1] o = out
        cdef idx_t i
        for i in range(seqs.shape[0]):
            self._check(seqs[i])
            o[i] = self.type_code[self.row(seqs[i])]
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
        """The stored events as arrays (seqs, ts, ids, val[n, a], kind[n, a], types),
        oldest first."""
        cdef idx_t n = <idx_t>(self.next_seq - self.base), na = self.n_attrs, i, a, r
        seqs = np.arange(self.base, self.next_seq, dtype=np.int64)
        ts = np.empty(n, np.int64)
        ids = np.empty(n, np.int64)
        types = np.empty(n, np.int32)
        val = np.empty((n, na), np.float64)
        kind = np.empty((n, na), np.int8)
        # typed views, no GIL: the store is most of a checkpoint's state, and an item
        # assignment per cell was most of the service's checkpoint time (py-spy)
        cdef int64_t[::1] ts_v = ts, ids_v = ids
        cdef int32_t[::1] types_v = types
        cdef double[:, ::1] val_v = val
        cdef int8_t[:, ::1] kind_v = kind
        with nogil:
            for i in range(n):
                r = self.row(self.base + i)
                ts_v[i] = self.ts[r]
                ids_v[i] = self.ids[r]
                types_v[i] = self.type_code[r]
                for a in range(na):
                    val_v[i, a] = self.val[r * na + a]
                    kind_v[i, a] = self.kind[r * na + a]
        return seqs, ts, ids, val, kind, types

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

    def load(self, int64_t base, ts, ids, val, kind, types=None):
        """Replace the contents by a dump (restore); the first event gets seq ``base``."""
        self.base = base
        self.next_seq = base
        self.append(np.ascontiguousarray(ts, np.int64), np.ascontiguousarray(ids, np.int64),
                    np.ascontiguousarray(val, np.float64).reshape(len(ts), self.n_attrs),
                    np.ascontiguousarray(kind, np.int8).reshape(len(ts), self.n_attrs),
                    None if types is None else np.ascontiguousarray(types, np.int32))


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


cdef inline bint _operand(EventStore st, const int32_t* ins, const double* cval,
                          const int8_t* ckind, const int64_t* slots, int8_t* k,
                          double* v) noexcept nogil:
    """A CONST or LOAD instruction's value (False: the attribute is missing)."""
    if ins[0] == OP_CONST:
        k[0], v[0] = ckind[ins[1]], cval[ins[1]]
        return True
    return _load(st, slots[ins[1]], ins[2], k, v)


cdef bint eval_pred(EventStore st, const int32_t* code, idx_t n_ins, const double* cval,
                    const int8_t* ckind, const int64_t* slots) noexcept nogil:
    """Evaluate one compiled conjunct over a record's events (slots -> seq numbers).

    Most conjuncts are one comparison of two attributes or constants (``a.x > 35``,
    ``t2.value > t1.value``): those are compared here, with the interpreter's
    rules, without its stack."""
    cdef int8_t k0, k1
    cdef double v0, v1, result
    if n_ins == 3 and OP_EQ <= code[6] <= OP_GE and code[0] <= OP_LOAD and \
            code[3] <= OP_LOAD:   # (CONST | LOAD) (CONST | LOAD) comparison
        return _operand(st, code, cval, ckind, slots, &k0, &v0) and \
            _operand(st, code + 3, cval, ckind, slots, &k1, &v1) and \
            _compare(code[6], k0, v0, k1, v1, &result) and result != 0.0
    return eval_pred_aggs(st, code, n_ins, cval, ckind, slots, NULL, NULL)


cdef inline bint _compare(int32_t op, int8_t k0, double v0, int8_t k1, double v1,
                          double* result) noexcept nogil:
    """A comparison (EQ NE LT LE GT GE) into ``result`` (1.0 true, 0.0 false); False
    when it fails: = and != of values of different kinds, an ordering of non-numbers."""
    if op == OP_EQ or op == OP_NE:
        if k0 != k1:
            return False
        result[0] = 1.0 if ((v0 == v1) == (op == OP_EQ)) else 0.0
        return True
    if k0 != KIND_NUM or k1 != KIND_NUM:
        return False
    if op == OP_LT:
        result[0] = 1.0 if v0 < v1 else 0.0
    elif op == OP_LE:
        result[0] = 1.0 if v0 <= v1 else 0.0
    elif op == OP_GT:
        result[0] = 1.0 if v0 > v1 else 0.0
    else:
        result[0] = 1.0 if v0 >= v1 else 0.0
    return True


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
            elif OP_EQ <= op <= OP_GE:
                if not _compare(op, k0, v0, k1, v1, &sv[sp - 1]):
                    return False
                sk[sp - 1] = KIND_BOOL
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


# ------------------------------------------------------------- Kleene lists
# Lists are stored once, beside the events (spec 5.1; dqcep._kernels.lists runs them).

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
            if h < self.evicted:
                raise IndexError(f"list {handle} reaches node {h}, which is no longer kept")
            o[i] = self.seq[ls_row(self, h)]
            h = self.parent[ls_row(self, h)]
        return out

    def elements_of(self, const int64_t[::1] handles):
        """Every list's elements at once: (offsets int64[n + 1], seqs), list i's event
        sequence numbers in ts order at ``seqs[offsets[i]:offsets[i + 1]]``."""
        cdef idx_t n = handles.shape[0], i, k
        cdef int64_t h, lost = -1
        offsets = np.zeros(n + 1, np.int64)
        cdef int64_t[::1] o = offsets
        for i in range(n):
            self._check(handles[i])
            o[i + 1] = o[i] + self.count[ls_row(self, handles[i])]
        seqs = np.empty(o[n], np.int64)
        cdef int64_t[::1] out = seqs
        with nogil:
            for i in range(n):
                h = handles[i]
                for k in range(o[i + 1] - 1, o[i] - 1, -1):  # from the last element back
                    if h < self.evicted:
                        lost = handles[i]
                        break
                    out[k] = self.seq[ls_row(self, h)]
                    h = self.parent[ls_row(self, h)]
        if lost >= 0:
            raise IndexError(f"list {lost} reaches a node that is no longer kept")
        return offsets, seqs

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

    def dump(self):
        """The kept nodes as arrays (a snapshot): (evicted, seq, parent, count, first,
        start, end, agg [n, 3 * n_aggs], ok [n, n_aggs]); ``load`` takes them back."""
        cdef idx_t lo = <idx_t>(self.evicted - self.offset), n = self.size, w = self.n_aggs
        cols = [np.empty(n, np.int64) for _ in range(6)]
        cdef int64_t[::1] c0 = cols[0], c1 = cols[1], c2 = cols[2], c3 = cols[3]
        cdef int64_t[::1] c4 = cols[4], c5 = cols[5]
        agg = np.empty((n, 3 * w), np.float64)
        ok = np.empty((n, w), np.uint8)
        cdef double[:, ::1] ag = agg
        cdef uint8_t[:, ::1] okv = ok
        cdef idx_t i, k
        for i in range(n):
            c0[i], c1[i], c2[i] = self.seq[lo + i], self.parent[lo + i], self.count[lo + i]
            c3[i], c4[i], c5[i] = self.first[lo + i], self.start[lo + i], self.end[lo + i]
            for k in range(3 * w):
                ag[i, k] = self.agg[3 * w * (lo + i) + k]
            for k in range(w):
                okv[i, k] = self.ok[w * (lo + i) + k]
        return (int(self.evicted), *cols, agg, ok)

    def load(self, int64_t evicted, seq, parent, count, first, start, end, agg, ok):
        """Replace the nodes with a ``dump``: handles go on from where they stood."""
        cdef const int64_t[::1] c0 = np.ascontiguousarray(seq, np.int64)
        cdef const int64_t[::1] c1 = np.ascontiguousarray(parent, np.int64)
        cdef const int64_t[::1] c2 = np.ascontiguousarray(count, np.int64)
        cdef const int64_t[::1] c3 = np.ascontiguousarray(first, np.int64)
        cdef const int64_t[::1] c4 = np.ascontiguousarray(start, np.int64)
        cdef const int64_t[::1] c5 = np.ascontiguousarray(end, np.int64)
        cdef idx_t n = c0.shape[0], w = self.n_aggs, i, k
        cdef const double[:, ::1] ag = np.ascontiguousarray(agg, np.float64).reshape(n, 3 * w)
        cdef const uint8_t[:, ::1] okv = np.ascontiguousarray(ok, np.uint8).reshape(n, w)
        if not (c1.shape[0] == c2.shape[0] == c3.shape[0] == c4.shape[0] == c5.shape[0] == n):
            raise ValueError("list store columns disagree in length")
        self.evicted = self.offset = evicted
        self.size = 0
        self._reserve(n)
        for i in range(n):
            self.seq[i], self.parent[i], self.count[i] = c0[i], c1[i], c2[i]
            self.first[i], self.start[i], self.end[i] = c3[i], c4[i], c5[i]
            for k in range(3 * w):
                self.agg[3 * w * i + k] = ag[i, k]
            for k in range(w):
                self.ok[w * i + k] = okv[i, k]
        self.size = n
        self.high_water = max(self.high_water, n)

    @property
    def nbytes(self) -> int:
        """Bytes held by the kept nodes."""
        return self.size * (6 * 8 + self.n_aggs * (3 * 8 + 1))
