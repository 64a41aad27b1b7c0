"""Predicate sets: the compiled conjuncts an operator checks, over records or lists.

A ``PredicateSet`` holds the bytecode of the conditions checked at one place (a
leaf, a join, a guard, a chain or run, an OUTPUT), checked where the kernel takes it
so that evaluation (nogil, unchecked) stays inside its stack, constants and record.
Every operator kernel (``leaves``, ``joins``, ``guards``, ``lists``, ``chains``,
``runs``, ``sase``) cimports it (``predicates.pxd``), with the input checks they
share (``check_offsets``, ``check_columns``).
"""
from libc.stdint cimport INT64_MAX, INT64_MIN, int8_t, int32_t, int64_t, uint8_t, uint64_t

import numpy as np

from dqcep._kernels._types cimport idx_t
from dqcep._kernels.store cimport (ATTR_ID, KIND_BOOL, KIND_MISSING, KIND_NUM, MAX_AGGS,
                                   MAX_STACK, OP_AGG_AVG, OP_AGG_COUNT, OP_AGG_MIN, OP_AGG_SUM,
                                   OP_AGG_MAX, eval_pred_aggs, OP_CONST, OP_EQUIV, OP_LOAD, OP_NEG, OP_NOT,
                                   OP_OR, EventStore, ListStore, eval_pred, ls_row)


cdef check_offsets(const int64_t[::1] start, idx_t total, str name):
    cdef idx_t i
    if start[0] != 0 or start[start.shape[0] - 1] != total:
        raise ValueError(f"{name} must run from 0 to {total}")
    for i in range(1, start.shape[0]):
        if start[i] < start[i - 1]:
            raise ValueError(f"{name} decreases at {i}")


cdef check_columns(EventStore st, const int32_t[::1] columns):
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
    ext_start, ext_kind, ext_slot), see predicates.pxd; ``holds_one`` and
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
        check_offsets(self.pred_start, self.code.shape[0], "pred_start")
        check_offsets(self.slot_start, self.slots.shape[0], "slot_start")
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
        check_offsets(self.rng_start, self.rng_slot.shape[0], "rng_start")
        check_offsets(self.ext_start, self.ext_slot.shape[0], "ext_start")
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
