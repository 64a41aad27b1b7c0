"""Operator processors: leaf filters, the SEQ/AND delta join, NOT guards.

Records are (start, end, key, slots): slots hold event sequence numbers of the
EventStore (-1: an OR variable that is not bound). The router (dqcep.runtime)
calls these once per vertex and batch; every loop over events, records and
candidate pairs runs here without the GIL.

Join (``join_delta``): for a vertex L op R with new records dL, dR this batch,
    AND: dL x old R, then (old L + dL) x dR;   SEQ: (old L + dL) x dR
(a SEQ never needs its right records later: any future left record ends at or
after the watermark, so after every stored right record starts). Queues are
appended in end-ts order, so a probe walks one key's chain from the newest
record back and stops at the first record ending more than W before the
probing record ends.
"""
from libc.stdint cimport INT64_MAX, INT64_MIN, int8_t, int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

import numpy as np

from dqcep._kernels.ring import StateBudgetExceeded

from dqcep._kernels._types cimport idx_t, ts_t
from dqcep._kernels._alloc cimport grow
from dqcep._kernels.ring cimport (COL_END, COL_IDS, COL_KEY, COL_START, KeyedQueue,
                                  RingBuffer, first_end_after, kq_at, kq_older, ring_push,
                                  ring_row)
from dqcep._kernels.store cimport (ATTR_ID, KIND_BOOL, KIND_MISSING, KIND_NUM, MAX_AGGS,
                                   MAX_STACK, OP_AGG_AVG, OP_AGG_COUNT, OP_AGG_MIN, OP_AGG_SUM,
                                   OP_AGG_MAX, eval_pred_aggs, OP_CONST, OP_EQUIV, OP_LOAD, OP_NEG, OP_NOT,
                                   OP_OR, EventStore, ListStore, cell_hash, eval_pred, ls_row)

ctypedef unsigned char[::1] uint8_t_view

cdef enum:
    OP_SEQ = 1
    OP_AND = 2

cdef enum:
    GUARD_GAP = 0
    GUARD_LEADING = 1
    GUARD_TRAILING = 2
    GUARD_AND = 3

# The planner's guard modes (``GuardSpec.mode``) as the kernel codes them: defined
# here, once, and imported by the runtime's compiler.
GUARD_MODES = {"GAP": GUARD_GAP, "LEADING": GUARD_LEADING, "TRAILING": GUARD_TRAILING,
               "AND": GUARD_AND}


cdef _check_offsets(const int64_t[::1] start, idx_t total, str name):
    cdef idx_t i
    if start[0] != 0 or start[start.shape[0] - 1] != total:
        raise ValueError(f"{name} must run from 0 to {total}")
    for i in range(1, start.shape[0]):
        if start[i] < start[i - 1]:
            raise ValueError(f"{name} decreases at {i}")


cdef _check_columns(EventStore st, const int32_t[::1] columns):
    cdef idx_t i
    for i in range(columns.shape[0]):
        if not 0 <= columns[i] < st.n_attrs:
            raise ValueError(f"key column {columns[i]} is not one of the store's "
                             f"{st.n_attrs}")


class BytecodeError(ValueError):
    """Predicate bytecode a kernel refuses (``predicate``: its index in the set;
    ``too_deep``: well formed, but more than MAX_STACK operands pending)."""

    predicate = -1
    too_deep = False

    def __init__(self, predicate, message, too_deep=False):
        super().__init__(f"predicate {predicate}: {message}")
        self.predicate, self.too_deep = predicate, too_deep


cdef class PredicateSet:
    """PredicateSet(code, pred_start, slots, slot_start, cval, ckind)

    The compiled conjuncts checked at one place: all instructions in ``code``
    (n x 3 int32), predicate p spanning ``pred_start[p]:pred_start[p+1]``; the
    slots it reads in ``slots[slot_start[p]:slot_start[p+1]]`` (it is required
    only when all are bound); a shared constant pool.

    ``ranges`` (for predicates over Kleene lists): (rng_start, rng_slot, rng_mode,
    ext_start, ext_kind, ext_slot), see operators.pxd; ``holds_one`` and
    ``holds_lists`` evaluate them (spec 5.1: every element, every element from
    the second on with the one before, every combination over several lists).

    The bytecode is checked here, where the kernel takes it, so that evaluation
    (nogil, unchecked) cannot read outside its stack, constants or record:
    known opcodes, constant indexes in the pool, each predicate leaving exactly
    one value on a stack of at most MAX_STACK. The record width and the store's
    columns are checked where records and a store come in (``mask``, the join,
    the guard) against ``max_slot`` and ``max_attr``.
    """
    def __init__(self, code, pred_start, slots, slot_start, cval, ckind, ranges=None):
        self.code = np.ascontiguousarray(code, dtype=np.int32).reshape(-1, 3)
        self.pred_start = np.ascontiguousarray(pred_start, dtype=np.int64)
        self.slots = np.ascontiguousarray(slots, dtype=np.int64)
        self.slot_start = np.ascontiguousarray(slot_start, dtype=np.int64)
        self.cval = np.ascontiguousarray(cval, dtype=np.float64)
        self.ckind = np.ascontiguousarray(ckind, dtype=np.int8)
        self.n = self.pred_start.shape[0] - 1
        if self.n < 0 or self.slot_start.shape[0] != self.n + 1:
            raise ValueError("pred_start and slot_start disagree")
        if self.cval.shape[0] != self.ckind.shape[0]:
            raise ValueError("cval and ckind disagree in length")
        for k in range(self.ckind.shape[0]):
            if not KIND_MISSING < self.ckind[k] <= KIND_BOOL:
                raise ValueError(f"constant {k} has kind {self.ckind[k]}")
        _check_offsets(self.pred_start, self.code.shape[0], "pred_start")
        _check_offsets(self.slot_start, self.slots.shape[0], "slot_start")
        self.max_slot, self.max_attr = -1, -1
        for j in range(self.slots.shape[0]):
            if self.slots[j] < 0:
                raise ValueError(f"slots[{j}] is {self.slots[j]}")
            self.max_slot = max(self.max_slot, self.slots[j])
        for p in range(self.n):
            self._check_predicate(p)
        if ranges is None:
            zeros = np.zeros(self.n + 1, dtype=np.int64)
            none = np.zeros(0, dtype=np.int32)
            ranges = (zeros, none, none, zeros, none, none)
        self.rng_start = np.ascontiguousarray(ranges[0], dtype=np.int64)
        self.rng_slot = np.ascontiguousarray(ranges[1], dtype=np.int32)
        self.rng_mode = np.ascontiguousarray(ranges[2], dtype=np.int32)
        self.ext_start = np.ascontiguousarray(ranges[3], dtype=np.int64)
        self.ext_kind = np.ascontiguousarray(ranges[4], dtype=np.int32)
        self.ext_slot = np.ascontiguousarray(ranges[5], dtype=np.int32)
        if self.rng_start.shape[0] != self.n + 1 or self.ext_start.shape[0] != self.n + 1:
            raise ValueError("rng_start and ext_start need one offset per predicate, and one")
        _check_offsets(self.rng_start, self.rng_slot.shape[0], "rng_start")
        _check_offsets(self.ext_start, self.ext_slot.shape[0], "ext_start")
        if self.rng_mode.shape[0] != self.rng_slot.shape[0] or \
                self.ext_kind.shape[0] != self.ext_slot.shape[0]:
            raise ValueError("rng_mode / ext_kind must have one entry per rng_slot / ext_slot")
        self.reads_lists = self.rng_slot.shape[0] > 0 or self.ext_slot.shape[0] > 0
        for p in range(self.n):
            if self.rng_start[p + 1] - self.rng_start[p] > MAX_RANGED or \
                    self.ext_start[p + 1] - self.ext_start[p] > MAX_EXTRAS:
                raise BytecodeError(p, f"ranges over more than {MAX_RANGED} lists or reads "
                                       f"more than {MAX_EXTRAS} list positions")
        for j in range(self.rng_slot.shape[0]):
            if not 0 <= self.rng_slot[j] < MAX_LIST_RECORD or not 0 <= self.rng_mode[j] <= 1:
                raise ValueError(f"rng_slot/rng_mode {j} out of range")
        for j in range(self.ext_slot.shape[0]):
            if not 0 <= self.ext_slot[j] < MAX_LIST_RECORD or not 0 <= self.ext_kind[j] <= 2:
                raise ValueError(f"ext_slot/ext_kind {j} out of range")
        for i in range(self.code.shape[0]):
            if self.code[i, 0] >= OP_AGG_COUNT:
                self.reads_lists = True

    cdef idx_t agg_values(self, idx_t p, ListStore ls, const int64_t* list_of_slot,
                          double* aggv, int8_t* aggk) noexcept nogil:
        """The values of predicate p's aggregate instructions, in order, as
        ``eval_pred_aggs`` takes them: from the list in slot s, ``list_of_slot[s]`` (a
        handle; -1: not a list, and the aggregate fails). Returns how many."""
        cdef idx_t i, k, r, w = ls.n_aggs if ls is not None else 0, n = 0
        cdef int32_t op, a, b
        for i in range(self.pred_start[p], self.pred_start[p + 1]):
            op, a, b = self.code[i, 0], self.code[i, 1], self.code[i, 2]
            if op < OP_AGG_COUNT:
                continue
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
        return n

    cdef bint holds_one(self, idx_t p, EventStore st, ListStore ls, const int64_t* rec,
                        const uint8_t* is_list, idx_t width, int64_t fixed_slot,
                        int64_t fixed_seq, int64_t fixed_prev,
                        int64_t fixed_first) noexcept nogil:
        """Predicate p on a record of ``width`` (<= MAX_LIST_RECORD) slots: ``rec[s]``
        an event, or a list handle where ``is_list[s]``; the caller checked that the
        slots p reads are bound.

        ``fixed_slot`` >= 0: that list slot is being given the element ``fixed_seq``
        (the one before it ``fixed_prev``, -1: none; the list's first ``fixed_first``;
        ``rec[fixed_slot]`` is the list before it, or -1), and p is checked for that
        element only (the earlier ones were checked as they came). Every other list
        p ranges over is ranged over whole: EACH every element, PAIRS every element
        from the second on with the one before; over several lists every
        combination. Extra slots (v[i-1], v[1], v[last]) follow the record."""
        cdef int64_t ev[MAX_LIST_RECORD + MAX_EXTRAS]
        cdef int64_t handles[MAX_LIST_RECORD]
        cdef int64_t prev[MAX_LIST_RECORD]
        cdef int64_t cur[MAX_RANGED]
        cdef double aggv[MAX_AGGS]
        cdef int8_t aggk[MAX_AGGS]
        cdef idx_t i, j, r0 = self.rng_start[p], e0 = self.ext_start[p]
        cdef idx_t nr = self.rng_start[p + 1] - r0, ne = self.ext_start[p + 1] - e0
        cdef int64_t s, node, parent, v
        cdef bint skip
        for i in range(width):
            if is_list[i]:
                handles[i] = rec[i] if i != fixed_slot else -1
                ev[i] = -1
            else:
                handles[i] = -1
                ev[i] = rec[i]
            prev[i] = -1
        for j in range(ne):
            ev[width + j] = -1
        self.agg_values(p, ls, handles, aggv, aggk)
        for i in range(nr):
            s = self.rng_slot[r0 + i]
            cur[i] = -2 if s == fixed_slot else rec[s]   # -2: the fixed element alone
        while True:
            skip = False
            for i in range(nr):
                s = self.rng_slot[r0 + i]
                if cur[i] == -2:
                    ev[s], prev[s] = fixed_seq, fixed_prev
                elif cur[i] < 0:
                    ev[s], prev[s] = -1, -1
                else:
                    node = ls_row(ls, cur[i])
                    ev[s] = ls.seq[node]
                    parent = ls.parent[node]
                    prev[s] = ls.seq[ls_row(ls, parent)] if parent >= 0 else -1
                if self.rng_mode[r0 + i] == 1 and prev[s] < 0:
                    skip = True   # a first element: a PAIRS condition starts at the second
            if not skip:
                for j in range(ne):
                    s = self.ext_slot[e0 + j]
                    if self.ext_kind[e0 + j] == 0:
                        v = prev[s]
                    elif s == fixed_slot:
                        v = fixed_first if self.ext_kind[e0 + j] == 1 else fixed_seq
                    elif rec[s] < 0:
                        v = -1
                    elif self.ext_kind[e0 + j] == 1:
                        v = ls.first[ls_row(ls, rec[s])]
                    else:
                        v = ls.seq[ls_row(ls, rec[s])]
                    ev[width + j] = v
                if not eval_pred_aggs(st, &self.code[self.pred_start[p], 0],
                                      self.pred_start[p + 1] - self.pred_start[p],
                                      &self.cval[0] if self.cval.shape[0] else NULL,
                                      &self.ckind[0] if self.ckind.shape[0] else NULL,
                                      ev, aggv, aggk):
                    return False
            i = nr - 1   # the next combination, the last list fastest
            while i >= 0:
                if cur[i] >= 0:
                    parent = ls.parent[ls_row(ls, cur[i])]
                    if parent >= 0:
                        cur[i] = parent
                        break
                    cur[i] = rec[self.rng_slot[r0 + i]]
                i -= 1
            if i < 0:
                return True

    cdef bint holds_lists(self, EventStore st, ListStore ls, const int64_t* rec,
                          const uint8_t* is_list, idx_t width, idx_t first,
                          idx_t last) noexcept nogil:
        cdef idx_t p
        for p in range(first, last):
            if self.bound(p, rec, width, -1) and not self.holds_one(
                    p, st, ls, rec, is_list, width, -1, -1, -1, -1):
                return False
        return True

    cdef bint holds_placed(self, EventStore st, ListStore ls, int64_t* rec,
                           const uint8_t* is_list, idx_t width, idx_t s, int64_t handle,
                           int64_t seq, idx_t first, idx_t last) noexcept nogil:
        cdef idx_t p
        cdef int64_t kept = rec[s], prev = -1, first_seq = seq
        cdef bint ok = True
        if is_list[s]:
            if handle >= 0:
                prev, first_seq = ls.seq[ls_row(ls, handle)], ls.first[ls_row(ls, handle)]
            rec[s] = handle
            for p in range(first, last):
                if self.bound(p, rec, width, s) and not self.holds_one(
                        p, st, ls, rec, is_list, width, s, seq, prev, first_seq):
                    ok = False
                    break
        else:
            rec[s] = seq
            ok = self.holds_lists(st, ls, rec, is_list, width, first, last)
        rec[s] = kept
        return ok

    def mask_lists(self, EventStore st, ListStore ls, const int64_t[:, ::1] recs, is_list):
        """``mask`` for records whose ``is_list`` slots hold Kleene lists."""
        n = recs.shape[0]
        out = np.ones(n, dtype=bool)
        cdef uint8_t_view o = out.view(np.uint8)
        cdef const uint8_t[::1] lists = np.ascontiguousarray(is_list, dtype=np.uint8)
        cdef idx_t i, width = recs.shape[1]
        if self.n == 0 or n == 0:
            return out
        if lists.shape[0] != width or width > MAX_LIST_RECORD:
            raise ValueError(f"is_list must name each of the {width} slots (at most "
                             f"{MAX_LIST_RECORD})")
        if self.reads_lists and ls is None:
            raise ValueError("predicates over lists need the engine's ListStore")
        self.check_lists_inputs(st, width)
        with nogil:
            for i in range(n):
                o[i] = self.holds_lists(st, ls, &recs[i, 0], &lists[0], width, 0, self.n)
        return out

    def check_slots(self, idx_t width):
        """ValueError unless records of ``width`` slots (extra slots after them) hold
        every slot the predicates read, range over or read a list position of."""
        cdef idx_t j
        if width > MAX_LIST_RECORD and self.reads_lists:
            raise ValueError(f"records over lists have at most {MAX_LIST_RECORD} slots")
        for j in range(self.rng_slot.shape[0]):
            if self.rng_slot[j] >= width:
                raise ValueError(f"a predicate ranges over slot {self.rng_slot[j]}, records "
                                 f"have {width}")
        for j in range(self.ext_slot.shape[0]):
            if self.ext_slot[j] >= width:
                raise ValueError(f"a predicate reads a list position of slot "
                                 f"{self.ext_slot[j]}, records have {width}")
        if self.max_slot >= width + MAX_EXTRAS:
            raise ValueError(f"the predicates read slot {self.max_slot}, records have "
                             f"{width}")

    def check_list_slots(self, const uint8_t[::1] is_list):
        """``check_slots`` for records whose slots ``is_list`` says hold lists: ValueError
        unless every slot a predicate ranges over, or reads a list position of, holds
        a list (a run's or a chain's slots: their Kleene items)."""
        cdef idx_t j, k = is_list.shape[0]
        for j in range(self.rng_slot.shape[0]):
            if not 0 <= self.rng_slot[j] < k or not is_list[self.rng_slot[j]]:
                raise ValueError(f"a condition ranges over slot {self.rng_slot[j]}, which "
                                 "holds no list")
        for j in range(self.ext_slot.shape[0]):
            if not 0 <= self.ext_slot[j] < k or not is_list[self.ext_slot[j]]:
                raise ValueError(f"a condition reads a list position of slot "
                                 f"{self.ext_slot[j]}, which holds no list")
        self.check_slots(k)

    def check_lists_inputs(self, EventStore st, idx_t width):
        """``check_inputs`` where extra slots (up to MAX_EXTRAS) follow the record."""
        self.check_slots(width)
        if self.max_attr >= st.n_attrs:
            raise ValueError(f"the predicates read column {self.max_attr}, the store has "
                             f"{st.n_attrs}")

    cdef _check_predicate(self, idx_t p):
        cdef idx_t i, depth = 0, aggs = 0
        cdef int32_t op, a, b
        cdef int64_t slot, col
        if self.pred_start[p + 1] == self.pred_start[p]:
            raise BytecodeError(p, "no instructions")
        for i in range(self.pred_start[p], self.pred_start[p + 1]):
            op, a, b = self.code[i, 0], self.code[i, 1], self.code[i, 2]
            if op == OP_CONST:
                if not 0 <= a < self.cval.shape[0]:
                    raise BytecodeError(p, f"CONST {a} outside the {self.cval.shape[0]} "
                                           f"constants")
                depth += 1
            elif op == OP_LOAD or op == OP_EQUIV:
                if op == OP_LOAD:
                    slot, col = a, b
                else:  # EQUIV t n reads slots 0..n-1
                    slot, col = b - 1, a
                if slot < -1 or (op == OP_LOAD and slot < 0) or col < ATTR_ID:
                    raise BytecodeError(p, f"instruction {i - self.pred_start[p]} reads "
                                           f"slot {slot}, column {col}")
                self.max_slot = max(self.max_slot, slot)
                self.max_attr = max(self.max_attr, <int32_t>col)
                depth += 1
            elif OP_AGG_COUNT <= op <= OP_AGG_MAX:  # an aggregate of the list in slot a
                if a < 0 or (op != OP_AGG_COUNT and b < ATTR_ID):
                    raise BytecodeError(p, f"instruction {i - self.pred_start[p]} aggregates "
                                           f"slot {a}, column {b}")
                self.max_slot = max(self.max_slot, a)
                if op != OP_AGG_COUNT:
                    self.max_attr = max(self.max_attr, b)
                aggs += 1
                if aggs > MAX_AGGS:
                    raise BytecodeError(p, f"more than {MAX_AGGS} aggregates")
                depth += 1
            elif op == OP_NEG or op == OP_NOT:
                if depth < 1:
                    raise BytecodeError(p, f"instruction {i - self.pred_start[p]} pops an "
                                           f"empty stack")
            elif OP_NOT < op <= OP_OR:
                if depth < 2:
                    raise BytecodeError(p, f"instruction {i - self.pred_start[p]} needs two "
                                           f"operands")
                depth -= 1
            else:
                raise BytecodeError(p, f"unknown opcode {op}")
            if depth > MAX_STACK:
                raise BytecodeError(p, f"more than {MAX_STACK} operands pending", True)
        if depth != 1:
            raise BytecodeError(p, f"leaves {depth} values on the stack, not one")

    cdef int check_inputs(self, EventStore st, idx_t width) except -1:
        """The records (``width`` slots) and the store hold what the code reads."""
        if self.max_slot >= width:
            raise ValueError(f"the predicates read slot {self.max_slot}, records have "
                             f"{width}")
        if self.max_attr >= st.n_attrs:
            raise ValueError(f"the predicates read column {self.max_attr}, the store has "
                             f"{st.n_attrs}")
        return 0

    cdef bint holds(self, EventStore st, const int64_t* rec) noexcept nogil:
        return self.holds_range(st, rec, 0, self.n)

    cdef bint bound(self, idx_t p, const int64_t* rec, idx_t width,
                    int64_t fixed_slot) noexcept nogil:
        """Are the record slots predicate p reads bound (>= 0)? Slots at or past
        ``width`` (extra slots) and ``fixed_slot`` (a list being given an element)
        count as bound."""
        cdef idx_t j
        cdef int64_t s
        for j in range(self.slot_start[p], self.slot_start[p + 1]):
            s = self.slots[j]
            if s < width and s != fixed_slot and rec[s] < 0:
                return False
        return True

    cdef bint holds_range(self, EventStore st, const int64_t* rec, idx_t first,
                          idx_t last) noexcept nogil:
        cdef idx_t p
        for p in range(first, last):
            if self.bound(p, rec, self.max_slot + 1, -1) and not eval_pred(
                    st, &self.code[self.pred_start[p], 0],
                    self.pred_start[p + 1] - self.pred_start[p],
                    &self.cval[0] if self.cval.shape[0] else NULL,
                    &self.ckind[0] if self.ckind.shape[0] else NULL, rec):
                return False
        return True

    def mask(self, EventStore st, const int64_t[:, ::1] recs):
        """Boolean mask: the records (rows of slots) on which every predicate holds."""
        n = recs.shape[0]
        out = np.ones(n, dtype=bool)
        cdef uint8_t_view o = out.view(np.uint8)
        cdef idx_t i
        if self.n == 0 or n == 0:
            return out
        self.check_inputs(st, recs.shape[1])
        with nogil:
            for i in range(n):
                o[i] = self.holds(st, &recs[i, 0])
        return out


cdef inline bint _key_of(EventStore st, idx_t r, const int32_t* cols, idx_t n_cols,
                         int64_t* key) noexcept nogil:
    """The partition key of the event in store row r over the [attr] columns (a hash
    of their cells); False if it lacks one of them."""
    cdef idx_t a, na = st.n_attrs
    cdef uint64_t h = 0x243f6a8885a308d3
    cdef int8_t k
    for a in range(n_cols):
        k = st.kind[r * na + cols[a]]
        if k == KIND_MISSING:
            return False
        h = h * <uint64_t>0x100000001b3 ^ cell_hash(k, st.val[r * na + cols[a]])
    key[0] = <int64_t>(h if n_cols else 0)
    return True


def leaf_keys(EventStore st, const int64_t[::1] seqs, const int32_t[::1] key_attrs):
    """(mask, keys): events carrying every key attribute, and their partition keys."""
    cdef idx_t n = seqs.shape[0], i
    ok = np.ones(n, dtype=bool)
    keys = np.zeros(n, dtype=np.int64)
    cdef uint8_t_view o = ok.view(np.uint8)
    cdef int64_t[::1] kv = keys
    if key_attrs.shape[0] == 0:
        return ok, keys
    _check_columns(st, key_attrs)
    with nogil:
        for i in range(n):
            o[i] = _key_of(st, <idx_t>(seqs[i] & st.mask), &key_attrs[0],
                           key_attrs.shape[0], &kv[i])
    return ok, keys


cdef class LeafRouter:
    """LeafRouter(leaf_type, key_start, key_cols, preds, pred_start, n_types)

    The EVENT vertices' work on a batch in one pass (``route``), instead of one
    pass per vertex: each event goes to the vertices of its type (``leaf_type``,
    engine type codes below ``n_types``) that take it: it carries their [attr]
    columns (``key_cols[key_start[j]:key_start[j + 1]]`` for leaf j) and their
    predicates hold (``preds`` numbers pred_start[j] .. pred_start[j + 1] - 1,
    over one slot: the event).
    """
    cdef readonly int32_t[::1] leaf_type
    cdef int64_t[::1] key_start
    cdef int32_t[::1] key_cols
    cdef readonly PredicateSet preds
    cdef int64_t[::1] pred_start
    cdef int64_t[::1] type_start    # the leaves of type t: type_leaf[type_start[t]:..[t + 1]]
    cdef int32_t[::1] type_leaf
    cdef readonly idx_t n_leaves, n_types

    def __init__(self, leaf_type, key_start, key_cols, PredicateSet preds, pred_start,
                 idx_t n_types):
        self.leaf_type = np.ascontiguousarray(leaf_type, dtype=np.int32)
        self.key_start = np.ascontiguousarray(key_start, dtype=np.int64)
        self.key_cols = np.ascontiguousarray(key_cols, dtype=np.int32)
        self.pred_start = np.ascontiguousarray(pred_start, dtype=np.int64)
        self.preds, self.n_types = preds, n_types
        n = self.n_leaves = self.leaf_type.shape[0]
        lt, ks, ps = np.asarray(self.leaf_type), np.asarray(self.key_start), \
            np.asarray(self.pred_start)
        if ks.shape[0] != n + 1 or ps.shape[0] != n + 1 or \
                (n and (lt.min() < 0 or lt.max() >= n_types)):
            raise ValueError("LeafRouter: a type, key range and predicate range per leaf, "
                             "types below n_types")
        if ks[0] != 0 or (np.diff(ks) < 0).any() or ks[-1] != self.key_cols.shape[0] or \
                ps[0] != 0 or (np.diff(ps) < 0).any() or ps[-1] != preds.n:
            raise ValueError("LeafRouter: key and predicate ranges must cover their arrays "
                             "in order")
        if preds.reads_lists or preds.max_slot > 0:
            raise ValueError("LeafRouter: leaf predicates read one slot, the event")
        order = np.argsort(lt, kind="stable")
        self.type_leaf = order.astype(np.int32)
        self.type_start = np.searchsorted(lt[order], np.arange(n_types + 1)).astype(np.int64)

    def route(self, EventStore st, const int64_t[::1] seqs, const int64_t[::1] ts,
              const int32_t[::1] types):
        """(inputs, taken) for a batch in stream order: ``inputs[j]``, the batch's
        events of leaf j's type; ``taken[j]``, (ts, keys, seqs) of the events leaf j
        takes, in the batch's order, with their partition keys."""
        cdef idx_t j, nl = self.n_leaves
        cdef int64_t* offsets = <int64_t*>grow(NULL, 2 * (nl + 1) * sizeof(int64_t))
        cdef int64_t* cursor = offsets + nl + 1
        try:
            inputs_arr, taken_arr = self._route_into(st, seqs, ts, types, offsets, cursor)
            taken = []
            for j in range(nl):
                rows = slice(offsets[j], cursor[j])
                taken.append((taken_arr[0, rows], taken_arr[1, rows], taken_arr[2, rows]))
        finally:
            free(offsets)
        return inputs_arr, taken

    cdef tuple _route_into(self, EventStore st, const int64_t[::1] seqs,
                           const int64_t[::1] ts, const int32_t[::1] types,
                           int64_t* offsets, int64_t* cursor):
        """``route``'s pass: (inputs, taken rows ts, keys, seqs [3, total]); leaf j's
        events at columns offsets[j] .. cursor[j] (both n_leaves long, the caller's)."""
        cdef idx_t n = seqs.shape[0], i, q, j, nt = self.n_types, nl = self.n_leaves
        cdef int32_t t
        cdef int64_t c, key, total = 0
        if ts.shape[0] != n or types.shape[0] != n:
            raise ValueError("route: seqs, ts and types differ in length")
        self.preds.check_inputs(st, 1)
        _check_columns(st, self.key_cols)
        # called once per slice of events: two arrays, whatever the number of leaves
        # (its fixed cost is paid by every plan with EVENT vertices)
        inputs_arr = np.zeros(nl, dtype=np.int64)
        cdef int64_t[::1] inputs = inputs_arr
        with nogil:
            for i in range(n):
                t = types[i]
                if 0 <= t < nt:
                    for q in range(self.type_start[t], self.type_start[t + 1]):
                        inputs[self.type_leaf[q]] += 1
            for j in range(nl):
                total += inputs[j]
        taken_arr = np.empty((3, total), dtype=np.int64)
        cdef int64_t[:, ::1] taken_rows = taken_arr
        with nogil:
            offsets[0] = 0
            for j in range(nl):
                offsets[j + 1] = offsets[j] + inputs[j]
                cursor[j] = offsets[j]
            for i in range(n):
                t = types[i]
                if t < 0 or t >= nt:
                    continue
                for q in range(self.type_start[t], self.type_start[t + 1]):
                    j = self.type_leaf[q]
                    key = 0
                    if self.key_start[j + 1] > self.key_start[j] and not _key_of(
                            st, <idx_t>(seqs[i] & st.mask), &self.key_cols[self.key_start[j]],
                            self.key_start[j + 1] - self.key_start[j], &key):
                        continue
                    if self.pred_start[j + 1] > self.pred_start[j] and \
                            not self.preds.holds_range(st, &seqs[i], self.pred_start[j],
                                                       self.pred_start[j + 1]):
                        continue
                    c = cursor[j]
                    taken_rows[0, c], taken_rows[1, c], taken_rows[2, c] = ts[i], key, seqs[i]
                    cursor[j] = c + 1
        return inputs_arr, taken_arr


cdef inline int64_t _event_of(const int64_t* rec, idx_t n, const uint8_t* is_list,
                              ListStore lists) noexcept nogil:
    """The first bound event of a record: a slot's event, or a list's last element
    (every element of a keyed list carries the key)."""
    cdef idx_t i
    for i in range(n):
        if rec[i] >= 0:
            if is_list[i]:
                return lists.seq[ls_row(lists, rec[i])]
            return rec[i]
    return -1


cdef inline bint _same_key(JoinSpec v, EventStore st, ListStore lists, const int64_t* l,
                           const int64_t* r) noexcept nogil:
    """Do the first bound events of the two records agree on every key attribute?
    (Called only for a keyed join: key_attrs is not empty.)"""
    cdef idx_t a, na = st.n_attrs, rl, rr, n_keys = v.key_attrs.shape[0]
    # a pointer, not a local memoryview: that would take a reference per call
    cdef const int32_t* key_attrs = &v.key_attrs[0]
    cdef int64_t sl = _event_of(l, v.n_left, &v.list_slots[0], lists)
    cdef int64_t sr = _event_of(r, v.n_right, &v.list_slots[v.n_left], lists)
    rl = <idx_t>(sl & st.mask)
    rr = <idx_t>(sr & st.mask)
    for a in range(n_keys):
        if st.kind[rl * na + key_attrs[a]] != st.kind[rr * na + key_attrs[a]] or \
                st.val[rl * na + key_attrs[a]] != st.val[rr * na + key_attrs[a]]:
            return False
    return True


cdef bint _share_event(ListStore lists, int64_t a, bint a_list, int64_t b,
                       bint b_list) noexcept nogil:
    """Do two bindings (an event, or a list's handle) hold a common event?"""
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


cdef class JoinSpec:
    """JoinSpec(op, window, n_left, n_right, key_attrs, preds)"""
    cdef readonly int op                  # 1 SEQ, 2 AND
    cdef readonly int64_t window          # ms, -1: unbounded
    cdef readonly idx_t n_left, n_right
    cdef readonly int32_t[::1] key_attrs  # [attr] partition key (store columns); empty: none
    cdef readonly PredicateSet preds
    cdef readonly bint keyed              # key_attrs is not empty
    cdef readonly bint has_preds          # preds is not empty
    cdef readonly uint8_t[::1] list_slots  # per slot of a pair: it holds a Kleene list
    cdef readonly bint has_lists

    def __init__(self, int op, int64_t window, idx_t n_left, idx_t n_right, key_attrs,
                 PredicateSet preds, list_slots=()):
        if op not in (OP_SEQ, OP_AND):
            raise ValueError(f"join op must be SEQ (1) or AND (2), got {op}")
        self.op, self.window, self.n_left, self.n_right = op, window, n_left, n_right
        mask = np.zeros(n_left + n_right + 1, dtype=np.uint8)
        mask[list(list_slots)] = 1
        self.list_slots = mask
        self.has_lists = bool(mask.any())
        self.key_attrs = np.ascontiguousarray(key_attrs, dtype=np.int32)
        self.preds = preds
        self.keyed = self.key_attrs.shape[0] > 0
        self.has_preds = preds.n > 0
        if self.has_lists:
            preds.check_slots(n_left + n_right)
        elif preds.max_slot >= n_left + n_right or preds.reads_lists:
            raise ValueError(f"the join's predicates read slot {preds.max_slot} or a list, a "
                             f"pair has {n_left + n_right} slots and no list")


cdef inline int _try_pair(JoinSpec v, EventStore st, ListStore lists, const int64_t* l,
                          const int64_t* r, int64_t* scratch, RingBuffer out) except -1 nogil:
    """Emit the pair (l, r) if it satisfies the operator, window, key and predicates."""
    cdef ts_t ls = l[COL_START], le = l[COL_END], rs = r[COL_START], re = r[COL_END]
    cdef ts_t start = ls if ls < rs else rs
    cdef ts_t end = le if le > re else re
    cdef idx_t i, j, nl = v.n_left, nr = v.n_right
    cdef int64_t* row
    if v.op == OP_SEQ:
        if le >= rs:
            return 0
    if v.window >= 0 and end - start > v.window:
        return 0
    if v.keyed and (l[COL_KEY] != r[COL_KEY] or not _same_key(
            v, st, lists, l + COL_IDS, r + COL_IDS)):
        return 0
    if v.op == OP_AND:
        for i in range(nl):
            if l[COL_IDS + i] < 0:
                continue
            for j in range(nr):
                if r[COL_IDS + j] < 0:
                    continue
                if v.has_lists and (v.list_slots[i] or v.list_slots[nl + j]):
                    if _share_event(lists, l[COL_IDS + i], v.list_slots[i], r[COL_IDS + j],
                                    v.list_slots[nl + j]):
                        return 0
                elif l[COL_IDS + i] == r[COL_IDS + j]:
                    return 0
    if v.has_preds:
        for i in range(nl):
            scratch[i] = l[COL_IDS + i]
        for j in range(nr):
            scratch[nl + j] = r[COL_IDS + j]
        if v.has_lists:
            if not v.preds.holds_lists(st, lists, scratch, &v.list_slots[0], nl + nr, 0,
                                       v.preds.n):
                return 0
        elif not v.preds.holds(st, scratch):
            return 0
    row = ring_push(out)
    row[COL_START], row[COL_END], row[COL_KEY] = start, end, l[COL_KEY]
    for i in range(nl):
        row[COL_IDS + i] = l[COL_IDS + i]
    for j in range(nr):
        row[COL_IDS + nl + j] = r[COL_IDS + j]
    return 1


cdef inline int _probe(JoinSpec v, EventStore st, ListStore lists, KeyedQueue q,
                       const int64_t* x, bint x_is_left, int64_t* scratch,
                       RingBuffer out) except -1 nogil:
    """Pair record x with every live record of its key in q (newest first)."""
    cdef int64_t pos = q.newest_with_key(x[COL_KEY])
    cdef int64_t* c
    cdef ts_t horizon = x[COL_END] - v.window
    while pos >= 0:
        c = kq_at(q, pos)
        if v.window >= 0 and c[COL_END] < horizon:
            break  # this and every older record ends too early for the window
        if x_is_left:
            _try_pair(v, st, lists, x, c, scratch, out)
        else:
            _try_pair(v, st, lists, c, x, scratch, out)
        pos = kq_older(q, pos)
    return 0


cdef inline void _record(int64_t* buf, idx_t width, const int64_t[::1] starts,
                         const int64_t[::1] ends, const int64_t[::1] keys,
                         const int64_t[:, ::1] ids, idx_t i) noexcept nogil:
    cdef idx_t j
    buf[COL_START], buf[COL_END], buf[COL_KEY] = starts[i], ends[i], keys[i]
    for j in range(width):
        buf[COL_IDS + j] = ids[i, j]


# A join input's new records of one slice, in end-ts order, read where they are: in
# columns (``join_delta``'s arrays; a leaf's routed events: start = end = ts, one slot)
# or in the rows of a child join's scratch ring (``JoinPipeline``)
ctypedef struct Delta:
    idx_t n
    idx_t n_ids
    const int64_t* start
    const int64_t* end
    const int64_t* key
    const int64_t* ids            # n x n_ids, row-major
    const int64_t* rows           # not NULL: the ring form, record i at
    idx_t head, mask, width       # rows + ((head + i) & mask) * width


cdef inline Delta _columns(idx_t n, idx_t n_ids, const int64_t* start, const int64_t* end,
                           const int64_t* key, const int64_t* ids) noexcept nogil:
    cdef Delta d
    d.n, d.n_ids, d.start, d.end, d.key, d.ids, d.rows = n, n_ids, start, end, key, ids, NULL
    d.head = d.mask = d.width = 0
    return d


cdef inline Delta _ring_rows(RingBuffer r) noexcept nogil:
    cdef Delta d = _columns(r.size, r.n_ids, NULL, NULL, NULL, NULL)
    d.rows, d.head, d.mask, d.width = r.data, r.head, r.mask, r.width
    return d


cdef inline int64_t _delta_end(const Delta* d, idx_t i) noexcept nogil:
    if d.rows != NULL:
        return d.rows[((d.head + i) & d.mask) * d.width + COL_END]
    return d.end[i]


cdef inline void _delta_record(int64_t* buf, const Delta* d, idx_t i) noexcept nogil:
    """Record i of the delta into buf (COL_IDS + n_ids words)."""
    cdef idx_t j
    cdef const int64_t* row
    if d.rows != NULL:
        row = d.rows + ((d.head + i) & d.mask) * d.width
        for j in range(COL_IDS + d.n_ids):
            buf[j] = row[j]
        return
    buf[COL_START], buf[COL_END], buf[COL_KEY] = d.start[i], d.end[i], d.key[i]
    for j in range(d.n_ids):
        buf[COL_IDS + j] = d.ids[i * d.n_ids + j]


cdef class OnDemand:
    """OnDemand(spec, left, left_on_demand, right)

    A SEQ vertex whose records are not kept (plan/joins.py): its parent builds
    them from the vertex's inputs when a record of its own right input comes.
    ``left``: the records of the vertex's left input, or ``left_on_demand``: that
    input built on demand too (one of the two); ``right``: its right input's
    records. The queues are engine state; this object only binds them to the
    compiled ``spec`` for one batch (``join_delta`` links the chain upwards).
    """
    cdef readonly JoinSpec spec
    cdef readonly KeyedQueue left
    cdef readonly OnDemand left_on_demand
    cdef readonly KeyedQueue right
    cdef OnDemand above        # the join built on demand above it (None: the top one)
    cdef JoinSpec top          # the parent that builds the chain
    cdef int64_t bound_end     # scratch: end of the right record bound at this level
    # this batch's new input records, appended to the queues only as the parent's
    # right records reach them (so a probe never walks past records that end later)
    cdef const int64_t[::1] l_start, l_end, l_key, r_start, r_end, r_key
    cdef const int64_t[:, ::1] l_ids, r_ids
    cdef idx_t l_next, r_next
    cdef readonly int64_t evicted  # records its queues dropped as the parent's window moved

    def __init__(self, JoinSpec spec, KeyedQueue left, OnDemand left_on_demand,
                 KeyedQueue right):
        if spec.op != OP_SEQ or spec.has_lists:
            raise ValueError("only a SEQ join without Kleene lists is built on demand")
        if (left is None) == (left_on_demand is None):
            raise ValueError("give the left input's queue or its on-demand join, not both")
        if right is None or right.n_ids != spec.n_right or \
                (left is not None and left.n_ids != spec.n_left) or \
                (left_on_demand is not None and
                 left_on_demand.spec.n_left + left_on_demand.spec.n_right != spec.n_left):
            raise ValueError("the inputs' record widths differ from the join's")
        self.spec, self.left, self.left_on_demand, self.right = spec, left, left_on_demand, right
        empty = np.empty(0, dtype=np.int64)
        self.l_start = self.l_end = self.l_key = self.r_start = self.r_end = self.r_key = empty
        self.l_ids = np.empty((0, spec.n_left), dtype=np.int64)
        self.r_ids = np.empty((0, spec.n_right), dtype=np.int64)
        self.l_next = self.r_next = 0
        self.evicted = 0

    def new_records(self, const int64_t[::1] l_start, const int64_t[::1] l_end,
                    const int64_t[::1] l_key, const int64_t[:, ::1] l_ids,
                    const int64_t[::1] r_start, const int64_t[::1] r_end,
                    const int64_t[::1] r_key, const int64_t[:, ::1] r_ids):
        """This batch's new records of its inputs (each in end-ts order; the left ones
        are ignored when the left input is built on demand too)."""
        if l_ids.shape[1] != self.spec.n_left or r_ids.shape[1] != self.spec.n_right or \
                l_end.shape[0] != l_start.shape[0] or l_key.shape[0] != l_start.shape[0] or \
                l_ids.shape[0] != l_start.shape[0] or r_end.shape[0] != r_start.shape[0] or \
                r_key.shape[0] != r_start.shape[0] or r_ids.shape[0] != r_start.shape[0]:
            raise ValueError("new_records: columns of different lengths or widths")
        self.l_start, self.l_end, self.l_key, self.l_ids = l_start, l_end, l_key, l_ids
        self.r_start, self.r_end, self.r_key, self.r_ids = r_start, r_end, r_key, r_ids
        self.l_next = self.r_next = 0


cdef int _catch_up(OnDemand od, ts_t before) except -1 nogil:
    """Append the chain's new input records that end before ``before`` (all with
    INT64_MAX) to its queues, in end-ts order. A right record is kept only if a left
    record of its key that ends before it starts is in reach of the window (SASE
    pushes an instance only onto a stack whose predecessor holds one): no left
    record still to come ends before it, so without one it never pairs."""
    cdef ts_t r_start
    while od.r_next < od.r_start.shape[0] and od.r_end[od.r_next] < before:
        r_start = od.r_start[od.r_next]
        _catch_up_left(od, r_start)
        if _left_in_reach(od, od.r_key[od.r_next], r_start, od.r_end[od.r_next]):
            od.right.append(r_start, od.r_end[od.r_next], od.r_key[od.r_next],
                            &od.r_ids[od.r_next, 0])
        od.r_next += 1
    return _catch_up_left(od, before)


cdef int _catch_up_left(OnDemand od, ts_t before) except -1 nogil:
    """The left input's new records that end before ``before``, into its queue (or,
    built on demand too, its own inputs', the same way)."""
    if od.left_on_demand is not None:
        return _catch_up(od.left_on_demand, before)
    while od.l_next < od.l_start.shape[0] and od.l_end[od.l_next] < before:
        od.left.append(od.l_start[od.l_next], od.l_end[od.l_next], od.l_key[od.l_next],
                       &od.l_ids[od.l_next, 0])
        od.l_next += 1
    return 0


cdef bint _left_in_reach(OnDemand od, int64_t key, ts_t start, ts_t end) noexcept nogil:
    """Does od's left input hold a record of ``key`` that ends before ``start`` and
    not so long before ``end`` that no pair of the two fits the window? (A left
    input built on demand has a record only where its right queue has one.)"""
    if od.left_on_demand is None:
        return _in_reach(od.left, key, start, end, od.spec.window)
    return _in_reach(od.left_on_demand.right, key, start, end, od.spec.window)


cdef bint _in_reach(KeyedQueue q, int64_t key, ts_t start, ts_t end,
                    int64_t window) noexcept nogil:
    cdef int64_t pos = q.newest_with_key(key)
    cdef int64_t* c
    while pos >= 0:
        c = kq_at(q, pos)
        if c[COL_END] < start:  # the newest that ends early enough: the nearest
            return window < 0 or end - c[COL_END] <= window
        pos = kq_older(q, pos)
    return False


cdef int _evict_chain(OnDemand od, ts_t cutoff) except -1 nogil:
    """Drop the chain's input records that end before ``cutoff`` (too old for every
    record of the parent still to come: they end no earlier than the current one)."""
    od.evicted += od.right.evict_end_before(cutoff)
    if od.left_on_demand is not None:
        return _evict_chain(od.left_on_demand, cutoff)
    od.evicted += od.left.evict_end_before(cutoff)
    return 0


cdef bint _holds_up(OnDemand od, EventStore st, const int64_t* rec) noexcept nogil:
    """The conditions of od, of every join above it and of the parent whose slots
    are all bound in rec hold (the others wait for their slots)."""
    if od.spec.has_preds and not od.spec.preds.holds_range(st, rec, 0, od.spec.preds.n):
        return False
    if od.above is not None:
        return _holds_up(od.above, st, rec)
    return not od.top.has_preds or od.top.preds.holds_range(st, rec, 0, od.top.preds.n)


cdef bint _pairs_hold(OnDemand od, ts_t start, EventStore st, ListStore lists,
                      const int64_t* rec, const int64_t* x) noexcept nogil:
    """Every slot is bound: each level's pair, and the parent's, inside its window
    and of one key (the SEQ order and the conditions are checked on the way down)."""
    if od.spec.window >= 0 and od.bound_end - start > od.spec.window:
        return False
    if od.spec.keyed and not _same_key(od.spec, st, lists, rec, rec + od.spec.n_left):
        return False
    if od.above is not None:
        return _pairs_hold(od.above, start, st, lists, rec, x)
    if od.top.window >= 0 and x[COL_END] - start > od.top.window:
        return False
    return not od.top.keyed or _same_key(od.top, st, lists, rec, rec + od.top.n_left)


cdef int _descend(OnDemand od, KeyedQueue q, bint bottom, ts_t before, int64_t key,
                  ts_t horizon, EventStore st, ListStore lists, int64_t* rec,
                  const int64_t* x, RingBuffer out) except -1 nogil:
    """SASE's construction over the chain: bind each record of q (od's right input,
    or with ``bottom`` its left input) of ``key`` that ends before ``before``, newest
    first; keep it if the conditions now bound hold; go down (the next join's right
    input, or this one's left input); with every slot bound, emit the parent's
    record. Each level's records are in end-ts order, so the walk stops at the first
    one too old for the window (``horizon``)."""
    cdef int64_t pos = q.newest_with_key(key)
    cdef int64_t* r
    cdef int64_t* row
    cdef idx_t at = 0 if bottom else od.spec.n_left, j, width = q.n_ids, n
    while pos >= 0:
        r = kq_at(q, pos)
        if r[COL_END] < horizon:
            break  # this and every older record ends too early for the window
        if r[COL_END] < before:
            for j in range(width):
                rec[at + j] = r[COL_IDS + j]
            if _holds_up(od, st, rec):
                if bottom:
                    if _pairs_hold(od, r[COL_START], st, lists, rec, x):
                        n = od.top.n_left + od.top.n_right
                        row = ring_push(out)
                        row[COL_START], row[COL_END], row[COL_KEY] = r[COL_START], \
                            x[COL_END], key
                        for j in range(n):
                            row[COL_IDS + j] = rec[j]
                else:
                    od.bound_end = r[COL_END]
                    if od.left_on_demand is None:
                        _descend(od, od.left, True, r[COL_START], key, horizon, st, lists,
                                 rec, x, out)
                    else:
                        _descend(od.left_on_demand, od.left_on_demand.right, False,
                                 r[COL_START], key, horizon, st, lists, rec, x, out)
        pos = kq_older(q, pos)
    for j in range(width):
        rec[at + j] = -1
    return 0


cdef _check_chain(OnDemand od, EventStore st):
    """ValueError unless every join of the chain can read what the store holds."""
    while od is not None:
        od.spec.preds.check_inputs(st, od.spec.n_left + od.spec.n_right)
        _check_columns(st, od.spec.key_attrs)
        od = od.left_on_demand


cdef _build_on_demand(JoinSpec v, OnDemand od, EventStore st, ListStore lists,
                      const int64_t[::1] r_start, const int64_t[::1] r_end,
                      const int64_t[::1] r_key, const int64_t[:, ::1] r_ids, RingBuffer out):
    """Each right record x of a SEQ whose left input is built on demand: the chain's
    records that end before x, paired with x (``join_delta``)."""
    cdef OnDemand level = od, above = None
    cdef idx_t j, k, width = v.n_left + v.n_right
    cdef ts_t horizon
    while level is not None:   # link the chain upwards
        level.above, level.top = above, v
        above, level = level, level.left_on_demand
    cdef int64_t* rec = <int64_t*>malloc((width + v.n_right + COL_IDS) * sizeof(int64_t))
    cdef int64_t* x = rec + width
    if rec == NULL:
        raise MemoryError()
    try:
        with nogil:
            for j in range(width):
                rec[j] = -1
            for k in range(r_start.shape[0]):
                _record(x, v.n_right, r_start, r_end, r_key, r_ids, k)
                _catch_up(od, x[COL_START])
                if v.window >= 0:
                    _evict_chain(od, x[COL_END] - v.window)
                for j in range(v.n_right):
                    rec[v.n_left + j] = x[COL_IDS + j]
                horizon = x[COL_END] - v.window if v.window >= 0 else INT64_MIN
                _descend(od, od.right, False, x[COL_START], x[COL_KEY], horizon, st, lists,
                         rec, x, out)
            _catch_up(od, INT64_MAX)
    finally:
        free(rec)
        level = od
        while level is not None:  # unlink: a cycle (above <-> left_on_demand) would
            level.above, level.top = None, None  # keep the batch's arrays until a GC
            level = level.left_on_demand


def join_delta(JoinSpec v, EventStore st, KeyedQueue left, KeyedQueue right,
               const int64_t[::1] l_start, const int64_t[::1] l_end, const int64_t[::1] l_key,
               const int64_t[:, ::1] l_ids, const int64_t[::1] r_start,
               const int64_t[::1] r_end, const int64_t[::1] r_key, const int64_t[:, ::1] r_ids,
               RingBuffer out, ListStore lists=None, OnDemand left_on_demand=None):
    """Join this batch's new records (left and right deltas) with each other and the stored ones.

    Each delta must be in end-ts order. They are taken merged in that order
    (left first on equal ends): a left record first probes the right queue
    (AND) and is then appended to the left queue; a right record probes the
    left queue and is then appended to the right queue (AND). So every pair is
    produced once, when the later of its two records comes, ``out`` receives
    pairs in end-ts order, and a probe only sees records ending no later than
    the probing one.

    ``left_on_demand`` (a SEQ whose left input is not kept; ``left`` is None and
    the left delta empty): a right record pairs with the left input's records
    built then from its inputs, those that end before it starts.

    A SEQ drops the left records that end too early for its window as it goes,
    so its queue holds a window, not a batch. Returns how many it dropped (the
    chain built on demand counts its own: ``OnDemand.evicted``).
    """
    cdef idx_t nl = l_start.shape[0], nr = r_start.shape[0]
    cdef int64_t* scratch
    cdef int64_t evicted
    cdef Delta dl, dr
    if l_ids.shape[1] != v.n_left or r_ids.shape[1] != v.n_right:
        raise ValueError(f"deltas have {l_ids.shape[1]} and {r_ids.shape[1]} slots, the join "
                         f"expects {v.n_left} and {v.n_right}")
    if v.has_lists and lists is None:
        raise ValueError("a join over Kleene lists needs the engine's ListStore")
    if left_on_demand is not None:
        if v.op != OP_SEQ or left is not None or nl:
            raise ValueError("a SEQ whose left input is built on demand takes no left "
                             "queue or left delta")
        if left_on_demand.spec.n_left + left_on_demand.spec.n_right != v.n_left:
            raise ValueError("the on-demand input's width differs from the join's")
        _check_chain(left_on_demand, st)
        _build_on_demand(v, left_on_demand, st, lists, r_start, r_end, r_key, r_ids, out)
        return 0
    _check_join(v, st, left, right)
    # (no element of an empty array is read: its pointer only stands for it)
    dl = _columns(nl, v.n_left, &l_start[0] if nl else NULL, &l_end[0] if nl else NULL,
                  &l_key[0] if nl else NULL, &l_ids[0, 0] if nl and v.n_left else NULL)
    dr = _columns(nr, v.n_right, &r_start[0] if nr else NULL, &r_end[0] if nr else NULL,
                  &r_key[0] if nr else NULL, &r_ids[0, 0] if nr and v.n_right else NULL)
    scratch = <int64_t*>grow(NULL, (v.n_left + v.n_right + 3) * sizeof(int64_t) * 2)
    try:
        with nogil:
            evicted = _join_core(v, st, left, right, &dl, &dr, out, lists, scratch)
    finally:
        free(scratch)
    return evicted


cdef int _check_join(JoinSpec v, EventStore st, KeyedQueue left, KeyedQueue right) except -1:
    """The queues and the store fit the join (its inputs' widths checked apart)."""
    if v.op == OP_AND and right is None:
        raise ValueError("an AND join needs a right queue")
    if left is None or left.n_ids != v.n_left or (right is not None and right.n_ids != v.n_right):
        raise ValueError("the queues' record widths differ from the join's")
    if v.has_lists:
        v.preds.check_lists_inputs(st, v.n_left + v.n_right)
    else:
        v.preds.check_inputs(st, v.n_left + v.n_right)
    _check_columns(st, v.key_attrs)
    return 0


cdef int64_t _join_core(JoinSpec v, EventStore st, KeyedQueue left, KeyedQueue right,
                        const Delta* dl, const Delta* dr, RingBuffer out, ListStore lists,
                        int64_t* scratch) except -1 nogil:
    """``join_delta`` on checked inputs: the deltas taken merged in end-ts order (left
    first on equal ends), pairs to ``out``; returns the left records it evicted.
    ``scratch``: 2 * (n_left + n_right + 3) words."""
    cdef idx_t i = 0, j = 0
    cdef int64_t evicted = 0
    cdef int64_t* x = scratch + v.n_left + v.n_right + 3
    while i < dl.n or j < dr.n:
        if j >= dr.n or (i < dl.n and _delta_end(dl, i) <= _delta_end(dr, j)):
            _delta_record(x, dl, i)
            if v.op == OP_AND:
                _probe(v, st, lists, right, x, True, scratch, out)
            elif v.window >= 0 and left.records.size == left.records.capacity:
                # SEQ, before the queue grows: no record still to come pairs
                # with those that end too early for the window
                evicted += left.evict_end_before(x[COL_END] - v.window)
            left.append(x[COL_START], x[COL_END], x[COL_KEY], x + COL_IDS)
            i += 1
        else:
            _delta_record(x, dr, j)
            _probe(v, st, lists, left, x, False, scratch, out)
            if v.op == OP_AND:
                right.append(x[COL_START], x[COL_END], x[COL_KEY], x + COL_IDS)
            j += 1
    return evicted


cdef inline int64_t _now_ns() noexcept nogil:
    """The monotonic clock in ns (``time.perf_counter_ns``'s on Linux)."""
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return <int64_t>t.tv_sec * 1000000000 + t.tv_nsec


cdef class JoinPipeline:
    """JoinPipeline(leaves, leaf_vertices, join_vertices, specs, left_inputs, right_inputs)

    A plan's EVENT vertices and the SEQ/AND joins above them, run on one slice of
    events in one call (``run``): the events routed to the leaves (``leaves``), then
    each join in topological order on its inputs' new records where they are (a leaf's
    routed events, a child join's scratch ring), with no records made in between.
    Compiled (a ``Program``'s); the engine's queues, scratch rings and counters are
    passed in. Join k reads ``left_inputs[k]`` and ``right_inputs[k]``: leaf j as j,
    join m (m < k) as n_leaves + m.
    """
    cdef readonly LeafRouter leaves
    cdef readonly tuple leaf_vertices, join_vertices
    cdef tuple specs
    cdef int64_t[::1] left_in, right_in
    cdef idx_t scratch_words

    def __init__(self, LeafRouter leaves, leaf_vertices, join_vertices, specs, left_inputs,
                 right_inputs):
        cdef JoinSpec spec
        n_leaves, n_joins = len(leaf_vertices), len(join_vertices)
        if n_leaves != leaves.n_leaves or len(specs) != n_joins or \
                len(left_inputs) != n_joins or len(right_inputs) != n_joins:
            raise ValueError("JoinPipeline: a vertex per leaf, a spec and two inputs per join")
        widths = [1] * n_leaves
        self.scratch_words = 0
        for k, spec in enumerate(specs):
            for x in (left_inputs[k], right_inputs[k]):
                if not 0 <= x < n_leaves + k:
                    raise ValueError(f"JoinPipeline: join {k} reads input {x}, not a leaf or "
                                     f"an earlier join")
            if widths[left_inputs[k]] != spec.n_left or widths[right_inputs[k]] != spec.n_right:
                raise ValueError(f"JoinPipeline: join {k}'s inputs' widths differ from its spec's")
            if spec.has_lists:
                raise ValueError("JoinPipeline: joins over Kleene lists run vertex by vertex")
            widths.append(spec.n_left + spec.n_right)
            self.scratch_words = max(self.scratch_words, 2 * (spec.n_left + spec.n_right + 3))
        self.leaves, self.specs = leaves, tuple(specs)
        self.leaf_vertices, self.join_vertices = tuple(leaf_vertices), tuple(join_vertices)
        self.left_in = np.ascontiguousarray(left_inputs, dtype=np.int64)
        self.right_in = np.ascontiguousarray(right_inputs, dtype=np.int64)

    def run(self, EventStore st, const int64_t[::1] seqs, const int64_t[::1] ts,
            const int32_t[::1] types, dict left_queues, dict right_queues, dict rings,
            dict stats, on_stop):
        """The slice (stored events, in ts order) through the leaves and the joins: each
        join's new records in ``rings[vertex]`` (emptied first); each vertex's counters
        (``stats[vertex]``: inputs, outputs, evictions, ns; the leaves share the routing's
        time) counted. A join whose state would grow past its limit makes no records
        of the slice; ``on_stop(vertex, StateBudgetExceeded)`` is called then and
        returns the vertices that stop with it: the joins among them that come later
        are passed over (no records, nothing counted), as the engine's vertex-by-vertex
        path does."""
        cdef idx_t nl = self.leaves.n_leaves, nj = len(self.join_vertices), j, k
        cdef int64_t began, share, evicted, n, off
        cdef int64_t* offsets = <int64_t*>grow(NULL, 2 * (nl + 1) * sizeof(int64_t))
        cdef int64_t* cursor = offsets + nl + 1
        cdef int64_t* scratch = NULL
        cdef Delta* deltas = NULL
        cdef int64_t[:, ::1] taken
        cdef int64_t[::1] inputs
        cdef JoinSpec spec
        cdef KeyedQueue left, right
        cdef RingBuffer ring
        dead = ()
        try:
            scratch = <int64_t*>grow(NULL, max(self.scratch_words, 1) * sizeof(int64_t))
            deltas = <Delta*>grow(NULL, (nl + nj) * sizeof(Delta))
            began = _now_ns()
            inputs_arr, taken_arr = self.leaves._route_into(st, seqs, ts, types, offsets,
                                                            cursor)
            inputs, taken = inputs_arr, taken_arr
            for j in range(nl):
                off, n = offsets[j], cursor[j] - offsets[j]
                # (an empty leaf's pointers are never read)
                deltas[j] = _columns(n, 1, &taken[0, off] if n else NULL,
                                     &taken[0, off] if n else NULL,
                                     &taken[1, off] if n else NULL,
                                     &taken[2, off] if n else NULL)
            share = (_now_ns() - began) // (nl if nl else 1)
            for j in range(nl):
                counts = stats[self.leaf_vertices[j]]
                counts.inputs += inputs[j]
                counts.outputs += deltas[j].n
                counts.ns += share
            for k in range(nj):
                v = self.join_vertices[k]
                ring = rings[v]
                ring.head = ring.size = 0
                deltas[nl + k] = _ring_rows(ring)
                if v in dead:  # its queries were stopped in this slice
                    continue
                spec = self.specs[k]
                left, right = left_queues.get(v), right_queues.get(v)
                _check_join(spec, st, left, right)
                began = _now_ns()
                try:
                    with nogil:
                        evicted = _join_core(spec, st, left, right, &deltas[self.left_in[k]],
                                             &deltas[self.right_in[k]], ring, None, scratch)
                except StateBudgetExceeded as err:
                    ring.head = ring.size = 0
                    evicted = 0
                    dead = on_stop(v, err)
                deltas[nl + k] = _ring_rows(ring)
                counts = stats[v]
                counts.inputs += deltas[self.left_in[k]].n + deltas[self.right_in[k]].n
                counts.outputs += ring.size
                counts.evictions += evicted
                counts.ns += _now_ns() - began
        finally:
            free(offsets)
            free(deltas)
            free(scratch)


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
                        if _share_event(lists, host[k], True, r[COL_IDS + j], False):
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
