"""Selection strategies (spec 5.2) as runs, without the GIL.

Under skip-till-next-match and the contiguity strategies a match is decided by
the events that come after its prefix in stream order (ts, id), so these
strategies are run as an automaton over the flat SEQ, not as joins: a *run* is a
prefix e1..ej of a match (its events in *slots*: a plain item's event, or a
Kleene item's list, stored once in the engine's ListStore), and every event,
taken in stream order, steps the runs it can touch once:

- it *fits* a next slot of the run (spec 5.2: the Kleene slot of ej again, or the
  following item; type, ts > ts(ej), within the window of e1, the run's [attr]
  value, and every condition whose variables are then bound) -> the run takes it;
  when it fits both, the run forks;
- skip-till-next-match: an event that fits no next slot is skipped;
- strict-contiguity: it ends the run (every event lies between);
- partition-contiguity: it ends the run when it carries the run's [attr] values,
  and is skipped otherwise.

A run whose last slot is filled is a match when the whole-list conditions hold
(aggregates, v[last]); a run in a trailing Kleene slot goes on and makes one
match per list. Every event that fits the first slot starts a run. Runs are kept
per chain key (the [attr] hash, or one chain), so an event steps the runs of its
key only: about one step per event per active run. The caller hands events in
stream order and only once no event can still come before them.
"""
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t
from libc.stdlib cimport free
from libc.string cimport memcpy

import numpy as np

from dqcep._kernels._alloc cimport grow
from dqcep._kernels._table cimport (Int64Table, table_free, table_get, table_init, table_remove,
                                    table_set)
from dqcep._kernels._types cimport idx_t
from dqcep._kernels.predicates cimport PredicateSet
from dqcep._kernels.ring cimport COL_END, COL_IDS, COL_KEY, COL_START, RingBuffer, ring_push
from dqcep._kernels.store cimport EventStore, ListStore, ls_row, same_cells

# strategies (the names are the language's: dqcep.lang.ast)
NEXT_MATCH, STRICT, PARTITION = 1, 2, 3
cdef enum:
    S_NEXT = 1
    S_STRICT = 2
    S_PARTITION = 3
    MAX_RUN_SLOTS = 32     # positive items of one SEQ
    # words of a run row
    R_START = 0            # ts of its first event
    R_LAST = 1             # ts of its last event
    R_KEY = 2              # its chain key
    R_POS = 3              # the slot of its last event
    R_NEXT = 4             # the next row of its chain (free rows: of the free list); -1 none
    R_FIRST = 5            # sequence number of its first event
    R_SLOTS = 6            # then per slot: an event's sequence number or a list handle


cdef class RunSpec:
    """A run operator, compiled (never changed): the slots' types and whether they
    are Kleene items, the conditions (``conds``, with their list ranges: those
    checked when an event is placed in slot s are ``slot_first[s]..slot_first[s+1]``,
    the whole-match ones ``slot_first[k]..conds.n``) and the [attr] store columns."""
    cdef readonly int strategy
    cdef readonly int64_t window
    cdef readonly idx_t k
    cdef int32_t[::1] slot_type
    cdef uint8_t[::1] slot_kleene
    cdef readonly PredicateSet conds
    cdef int64_t[::1] slot_first
    cdef int32_t[::1] key_cols

    def __init__(self, int strategy, int64_t window, slot_type, slot_kleene, PredicateSet conds,
                 slot_first, key_cols):
        cdef idx_t j
        self.strategy, self.window = strategy, window
        self.slot_type = np.ascontiguousarray(slot_type, dtype=np.int32)
        self.slot_kleene = np.ascontiguousarray(slot_kleene, dtype=np.uint8)
        self.k = self.slot_type.shape[0]
        self.conds = conds
        self.slot_first = np.ascontiguousarray(slot_first, dtype=np.int64)
        self.key_cols = np.ascontiguousarray(key_cols, dtype=np.int32)
        if strategy not in (S_NEXT, S_STRICT, S_PARTITION):
            raise ValueError(f"unknown strategy {strategy}")
        if not 1 <= self.k <= MAX_RUN_SLOTS or self.slot_kleene.shape[0] != self.k:
            raise ValueError(f"a run has 1..{MAX_RUN_SLOTS} slots, one kind per slot")
        if self.slot_first.shape[0] != self.k + 1 or self.slot_first[self.k] > conds.n:
            raise ValueError("slot_first must index the conditions")
        for j in range(self.k):
            if self.slot_first[j] > self.slot_first[j + 1]:
                raise ValueError("slot_first must not decrease")
        conds.check_list_slots(self.slot_kleene)


cdef class RunTable:
    """The runs of one run operator (its state): rows of R_SLOTS + k words in one
    block, chained per key (``heads``: key -> first row), freed rows reused."""
    cdef int64_t* rows
    cdef readonly idx_t k
    cdef readonly idx_t width
    cdef idx_t cap            # rows allocated
    cdef idx_t used           # rows ever handed out (the rest of the block is untouched)
    cdef int64_t free_head    # first free row, -1: none
    cdef readonly idx_t live  # runs held
    cdef readonly idx_t high_water
    cdef Int64Table heads

    def __cinit__(self, idx_t k):
        self.k, self.width = k, R_SLOTS + k
        self.rows = NULL
        self.cap = self.used = self.live = self.high_water = 0
        self.free_head = -1
        table_init(&self.heads, 16)

    def __dealloc__(self):
        free(self.rows)
        table_free(&self.heads)

    cdef int64_t _alloc(self) except -1 nogil:
        cdef int64_t r
        cdef idx_t cap
        if self.free_head >= 0:
            r = self.free_head
            self.free_head = self.rows[r * self.width + R_NEXT]
        else:
            if self.used == self.cap:
                cap = self.cap * 2 if self.cap else 64
                self.rows = <int64_t*>grow(self.rows, cap * self.width * sizeof(int64_t))
                self.cap = cap
            r = self.used
            self.used += 1
        self.live += 1
        if self.live > self.high_water:
            self.high_water = self.live
        return r

    cdef inline void _free(self, int64_t r) noexcept nogil:
        self.rows[r * self.width + R_NEXT] = self.free_head
        self.free_head = r
        self.live -= 1

    cdef inline int64_t* at(self, int64_t r) noexcept nogil:
        return self.rows + r * self.width

    cdef int _set_head(self, int64_t key, int64_t r) except -1 nogil:
        if r >= 0:
            table_set(&self.heads, key, r)
        else:
            table_remove(&self.heads, key)
        return 0

    @property
    def nbytes(self) -> int:
        """Bytes held: the row block and the key table."""
        return self.cap * self.width * 8 + (self.heads.mask + 1) * 16

    def evict_start_before(self, int64_t cutoff) -> int:
        """Drop every run that starts before ``cutoff`` (no event it could still take
        can come); returns how many."""
        cdef idx_t i, n = 0
        cdef int64_t r, nxt, prev, head
        keys = []
        for i in range(self.heads.mask + 1):
            if self.heads.slots[i].value < 0:
                continue
            head, prev, r = self.heads.slots[i].value, -1, self.heads.slots[i].value
            while r >= 0:
                nxt = self.at(r)[R_NEXT]
                if self.at(r)[R_START] < cutoff:
                    if prev >= 0:
                        self.at(prev)[R_NEXT] = nxt
                    else:
                        head = nxt
                    self._free(r)
                    n += 1
                else:
                    prev = r
                r = nxt
            if head != self.heads.slots[i].value:
                keys.append((self.heads.slots[i].key, head))
        for key, head in keys:  # after the scan: removing moves entries of the table
            self._set_head(key, head)
        return n

    def dump(self) -> np.ndarray:
        """Every run, one row each (chains are rebuilt by ``load``)."""
        cdef idx_t i
        cdef int64_t r
        out = np.empty((self.live, self.width), dtype=np.int64)
        cdef int64_t[:, ::1] o = out
        cdef idx_t n = 0
        for i in range(self.heads.mask + 1):
            if self.heads.slots[i].value < 0:
                continue
            r = self.heads.slots[i].value
            while r >= 0:
                memcpy(&o[n, 0], self.at(r), self.width * sizeof(int64_t))
                n += 1
                r = self.at(r)[R_NEXT]
        return out

    def load(self, const int64_t[:, ::1] rows) -> None:
        """Add the runs ``dump`` gave (into an empty table)."""
        cdef idx_t i
        cdef int64_t r, head
        if rows.shape[0] and rows.shape[1] != self.width:
            raise ValueError(f"runs of {self.k} slots have {self.width} words")
        for i in range(rows.shape[0] - 1, -1, -1):
            r = self._alloc()
            memcpy(self.at(r), &rows[i, 0], self.width * sizeof(int64_t))
            head = table_get(&self.heads, rows[i, R_KEY])
            self.at(r)[R_NEXT] = head
            self._set_head(rows[i, R_KEY], r)


cdef int _emit(RunSpec sp, PredicateSet ps, EventStore st, ListStore ls, const int64_t* row,
               RingBuffer out) except -1 nogil:
    """A run with every slot filled: a match if the whole-match conditions hold."""
    cdef idx_t p
    cdef int64_t* o
    if not ps.holds_lists(st, ls, row + R_SLOTS, &sp.slot_kleene[0], sp.k,
                          sp.slot_first[sp.k], ps.n):
        return 0
    o = ring_push(out)
    o[COL_START] = row[R_START]
    o[COL_END] = row[R_LAST]
    o[COL_KEY] = row[R_KEY]
    memcpy(o + COL_IDS, row + R_SLOTS, sp.k * sizeof(int64_t))
    return 1


cdef bint _fits(RunSpec sp, PredicateSet ps, EventStore st, ListStore ls, const int64_t* row, idx_t s,
                int64_t seq, int64_t ts, int32_t etype) noexcept nogil:
    """Does event seq fit slot s of the run (its type, after the run's last event,
    within the window, every condition of slot s); the [attr] check is the caller's."""
    cdef int64_t slots[MAX_RUN_SLOTS]
    if etype != sp.slot_type[s] or ts <= row[R_LAST] or ts - row[R_START] > sp.window:
        return False
    memcpy(slots, row + R_SLOTS, sp.k * sizeof(int64_t))
    return ps.holds_placed(st, ls, slots, &sp.slot_kleene[0], sp.k, s,
                           slots[s] if s == row[R_POS] else -1, seq,
                           sp.slot_first[s], sp.slot_first[s + 1])


cdef int _take(RunSpec sp, EventStore st, ListStore ls, int64_t* row, idx_t s, int64_t seq,
               int64_t ts) except -1 nogil:
    """Put event seq in slot s of the run (a list grows by it, or starts)."""
    if sp.slot_kleene[s]:
        row[R_SLOTS + s] = ls.append(st, row[R_SLOTS + s] if s == row[R_POS] else -1, seq)
    else:
        row[R_SLOTS + s] = seq
    row[R_POS] = s
    row[R_LAST] = ts
    return 0


def run_step(RunSpec sp, RunTable runs, EventStore st, ListStore ls,
             const int64_t[::1] seqs, const int64_t[::1] ts, const int32_t[::1] types,
             const int64_t[::1] keys, const uint8_t[::1] keyed, RingBuffer out):
    """Events in stream order (``seqs`` in the store, ``ts``, ``types``: the operator's
    type codes, -1 for any other event), each with its chain key (``keys``: the
    [attr] hash where the operator has [attr] and the strategy keys its chains,
    else 0) and whether it carries the [attr] values (``keyed``). Matches go to
    ``out`` (k ids: per slot an event or a list handle), in the order they are made.
    Returns the number of matches."""
    cdef idx_t n = seqs.shape[0], j, k = sp.k, w = runs.width
    cdef int64_t made = 0, r, nxt, prev, head, born, r2, key
    cdef int64_t* row
    cdef int32_t s, pos, t
    cdef bint fit_same, fit_next, key_ok, chained
    cdef bint by_key = sp.key_cols.shape[0] > 0 and sp.strategy != S_STRICT
    cdef bint relevant
    cdef PredicateSet ps = sp.conds
    if ts.shape[0] != n or types.shape[0] != n or keys.shape[0] != n or keyed.shape[0] != n:
        raise ValueError("seqs, ts, types, keys and keyed must have one entry per event")
    if runs.k != k or out.n_ids != k:
        raise ValueError(f"a run operator of {k} slots needs runs and records of {k} ids")
    ps.check_lists_inputs(st, k)
    if sp.key_cols.shape[0]:
        for t in range(sp.key_cols.shape[0]):
            if not 0 <= sp.key_cols[t] < st.n_attrs:
                raise ValueError("an [attr] column is not in the event store")
    with nogil:
        for j in range(n):
            t = types[j]
            relevant = False
            for s in range(k):
                if sp.slot_type[s] == t:
                    relevant = True
                    break
            if sp.strategy == S_NEXT and not relevant:
                continue  # skipped: fits no slot
            if by_key and not keyed[j]:
                continue  # without the [attr] values: fits no slot, lies in no partition
            key = keys[j] if by_key else 0
            head = table_get(&runs.heads, key)
            prev, r, born = -1, head, -1
            while r >= 0:
                row = runs.at(r)
                nxt = row[R_NEXT]
                if ts[j] - row[R_START] > sp.window:
                    chained = False   # nothing it could still take can come
                else:
                    key_ok = sp.key_cols.shape[0] == 0 or same_cells(st, sp.key_cols,
                                                                       row[R_FIRST], seqs[j])
                    if sp.strategy == S_PARTITION and not key_ok:
                        prev, r = r, nxt   # another partition (a hash collision)
                        continue
                    pos = <int32_t>row[R_POS]
                    fit_same = key_ok and sp.slot_kleene[pos] and \
                        _fits(sp, ps, st, ls, row, pos, seqs[j], ts[j], t)
                    fit_next = key_ok and pos + 1 < k and \
                        _fits(sp, ps, st, ls, row, pos + 1, seqs[j], ts[j], t)
                    chained = True
                    if fit_next and fit_same:   # both: the run forks
                        r2 = runs._alloc()
                        row = runs.at(r)
                        memcpy(runs.at(r2), row, w * sizeof(int64_t))
                        _take(sp, st, ls, runs.at(r2), pos + 1, seqs[j], ts[j])
                        if pos + 1 == k - 1:
                            made += _emit(sp, ps, st, ls, runs.at(r2), out)
                        if pos + 1 == k - 1 and not sp.slot_kleene[pos + 1]:
                            runs._free(r2)
                        else:
                            runs.at(r2)[R_NEXT] = born
                            born = r2
                        row = runs.at(r)
                        _take(sp, st, ls, row, pos, seqs[j], ts[j])
                        if pos == k - 1:
                            made += _emit(sp, ps, st, ls, row, out)
                    elif fit_same:
                        _take(sp, st, ls, row, pos, seqs[j], ts[j])
                        if pos == k - 1:
                            made += _emit(sp, ps, st, ls, row, out)
                    elif fit_next:
                        _take(sp, st, ls, row, pos + 1, seqs[j], ts[j])
                        if pos + 1 == k - 1:
                            made += _emit(sp, ps, st, ls, row, out)
                            chained = sp.slot_kleene[pos + 1]   # a trailing list goes on
                    elif sp.strategy != S_NEXT:
                        chained = False   # contiguity: it lay between
                if chained:
                    prev = r
                else:
                    if prev >= 0:
                        runs.at(prev)[R_NEXT] = nxt
                    else:
                        head = nxt
                    runs._free(r)
                r = nxt
            # the runs it forked, then the run it starts, go first in the chain
            while born >= 0:
                nxt = runs.at(born)[R_NEXT]
                runs.at(born)[R_NEXT] = head
                head, born = born, nxt
            if t == sp.slot_type[0] and (sp.key_cols.shape[0] == 0 or keyed[j]):
                r = runs._alloc()
                row = runs.at(r)
                row[R_START], row[R_LAST], row[R_KEY] = ts[j], ts[j] - 1, key
                row[R_POS], row[R_FIRST] = -1, seqs[j]
                for s in range(k):
                    row[R_SLOTS + s] = -1
                if _fits(sp, ps, st, ls, row, 0, seqs[j], ts[j], t):
                    _take(sp, st, ls, row, 0, seqs[j], ts[j])
                    if k == 1:
                        made += _emit(sp, ps, st, ls, row, out)
                    if k > 1 or sp.slot_kleene[0]:
                        row[R_NEXT] = head
                        head = r
                        r = -1
                if r >= 0:
                    runs._free(r)
            runs._set_head(key, head)
    return made
