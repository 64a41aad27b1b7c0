"""The EVENT vertices: events of a type, with their [attr] keys, through their filters.

``LeafRouter.route`` does every EVENT vertex's work on a slice in one pass (each
event to the leaves of its type that take it); ``leaf_keys`` gives the partition
keys of events (a RUN vertex's, a policy's partitions). The joins above the leaves
call ``LeafRouter._route_into`` from ``JoinPipeline`` (``leaves.pxd``).
"""
from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport free

import numpy as np

from dqcep._kernels._types cimport idx_t
from dqcep._kernels._alloc cimport grow
from dqcep._kernels.predicates cimport PredicateSet, check_columns, uint8_t_view
from dqcep._kernels.store cimport KIND_MISSING, EventStore, cell_hash


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
    check_columns(st, key_attrs)
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
        check_columns(st, self.key_cols)
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
