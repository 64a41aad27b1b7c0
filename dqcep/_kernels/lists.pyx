"""Kleene lists and the iteration operator (spec 5.1), without the GIL.

``ListStore`` (in ``dqcep._kernels.store``, beside the events): every list an
engine makes, once. A list is a *node*: its last
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
from libc.stdint cimport int8_t, int32_t, int64_t

from dqcep._kernels._types cimport idx_t
from dqcep._kernels.predicates cimport PredicateSet
from dqcep._kernels.ring cimport (COL_END, COL_IDS, COL_KEY, COL_START, KeyedQueue, RingBuffer,
                                  kq_at, kq_older, ring_push)
from dqcep._kernels.store cimport (MAX_AGGS, EventStore, ListStore, eval_pred_aggs,
                                   ls_row)


cdef bint holds_with_lists(PredicateSet ps, EventStore st, const int64_t* rec,
                           ListStore ls, const int64_t* list_of_slot) noexcept nogil:
    """``ps.holds(st, rec)`` where aggregate instructions read the lists: the list in
    slot s of the record is ``list_of_slot[s]`` (a handle; -1: not a list). A
    PredicateSet holds at most MAX_AGGS aggregates per predicate (checked when built)."""
    cdef idx_t p
    cdef double aggv[MAX_AGGS]
    cdef int8_t aggk[MAX_AGGS]
    for p in range(ps.n):
        if not ps.bound(p, rec, ps.max_slot + 1, -1):
            continue
        ps.agg_values(p, ls, list_of_slot, aggv, aggk)
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
