"""The SEQ/AND delta join, joins built on demand, and the join pipeline.

Records are (start, end, key, slots): slots hold event sequence numbers of the
EventStore (-1: an OR variable that is not bound). The router (dqcep.runtime)
calls these once per vertex and batch; every loop over records and candidate
pairs runs here without the GIL.

Join (``join_delta``): for a vertex L op R with new records dL, dR this batch,
    AND: dL x old R, then (old L + dL) x dR;   SEQ: (old L + dL) x dR
(a SEQ never needs its right records later: any future left record ends at or
after the watermark, so after every stored right record starts). Queues are
appended in end-ts order, so a probe walks one key's chain from the newest
record back and stops at the first record ending more than W before the
probing record ends. ``JoinPipeline`` runs a plan's leaves (``leaves.LeafRouter``)
and the joins above them on one slice in one call.
"""
from libc.stdint cimport INT64_MAX, INT64_MIN, int8_t, int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

import numpy as np

from dqcep._kernels.ring import StateBudgetExceeded

from dqcep._kernels._types cimport idx_t, ts_t
from dqcep._kernels._alloc cimport grow
from dqcep._kernels.leaves cimport LeafRouter
from dqcep._kernels.predicates cimport PredicateSet, check_columns
from dqcep._kernels.ring cimport (COL_END, COL_IDS, COL_KEY, COL_START, KeyedQueue,
                                  RingBuffer, first_end_after, kq_at, kq_older, ring_push,
                                  ring_row)
from dqcep._kernels.store cimport EventStore, ListStore, ls_row, share_event

cdef enum:
    OP_SEQ = 1
    OP_AND = 2


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
                    if share_event(lists, l[COL_IDS + i], v.list_slots[i], r[COL_IDS + j],
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

    A SEQ vertex whose records are not kept (``dqcep.plan.joins``): its parent builds
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
        check_columns(st, od.spec.key_attrs)
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
    check_columns(st, v.key_attrs)
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
