# Python-visible API of dqcep._kernels.operators (C types in comments).
from typing import Any, Callable, Container, Sequence

import numpy as np
import numpy.typing as npt

from dqcep._kernels.ring import KeyedQueue, RingBuffer
from dqcep._kernels.store import EventStore, ListStore

GUARD_MODES: dict[str, int]  # the planner's guard modes ("GAP", ...) as kernel codes

class BytecodeError(ValueError):
    predicate: int   # index of the offending predicate in the set
    too_deep: bool   # well formed, but deeper than MAX_STACK

class PredicateSet:
    n: int  # idx_t: predicates
    def __init__(
        self,
        code: "npt.NDArray[np.int32]",      # int32_t[:, ::1], shape (ops, 3): (opcode, a, b)
        pred_start: "npt.ArrayLike",        # int64_t[::1], n + 1 offsets into code
        slots: "npt.ArrayLike",             # int64_t[::1]: slots each predicate reads
        slot_start: "npt.ArrayLike",        # int64_t[::1], n + 1 offsets into slots
        cval: "npt.NDArray[np.float64]",    # double[::1]: constants
        ckind: "npt.NDArray[np.int8]",      # int8_t[::1]: their kinds
        ranges: tuple | None = None,        # Kleene lists: (rng_start, rng_slot, rng_mode,
                                            #   ext_start, ext_kind, ext_slot)
    ) -> None: ...  # BytecodeError when the code is not well formed
    reads_lists: bool   # some predicate ranges over a list, reads a list position or aggregates
    def mask(self, st: EventStore,
             recs: "npt.NDArray[np.int64]") -> "npt.NDArray[np.bool_]": ...  # [n, width]
    def mask_lists(self, st: EventStore, ls: ListStore | None,
                   recs: "npt.NDArray[np.int64]",       # [n, width]: events or list handles
                   is_list: "npt.ArrayLike",            # uint8 per slot
                   ) -> "npt.NDArray[np.bool_]": ...
    def check_slots(self, width: int) -> None: ...                      # ValueError
    def check_list_slots(self, is_list: "npt.ArrayLike") -> None: ...  # uint8 per slot; ValueError
    def check_lists_inputs(self, st: EventStore, width: int) -> None: ...  # ValueError

def leaf_keys(
    st: EventStore,
    seqs: "npt.NDArray[np.int64]",       # const int64_t[::1]
    key_attrs: "npt.NDArray[np.int32]",  # const int32_t[::1]
) -> tuple["npt.NDArray[np.bool_]", "npt.NDArray[np.int64]"]: ...  # (all keys present, key hash)

class LeafRouter:
    """The EVENT vertices' type, [attr] and filter work on a batch, in one pass."""
    leaf_type: "npt.NDArray[np.int32]"
    preds: PredicateSet
    n_leaves: int
    n_types: int
    def __init__(self, leaf_type: "npt.ArrayLike",   # engine type code per leaf
                 key_start: "npt.ArrayLike",          # int64 [n_leaves + 1] into key_cols
                 key_cols: "npt.ArrayLike",           # int32 store columns of the [attr]s
                 preds: PredicateSet,                 # every leaf's predicates, over 1 slot
                 pred_start: "npt.ArrayLike",         # int64 [n_leaves + 1] into preds
                 n_types: int) -> None: ...           # ValueError on inconsistent ranges
    def route(self, st: EventStore,
              seqs: "npt.NDArray[np.int64]", ts: "npt.NDArray[np.int64]",
              types: "npt.NDArray[np.int32]",         # engine type codes, -1: none
              ) -> tuple["npt.NDArray[np.int64]",     # per leaf: events of its type
                         list[tuple["npt.NDArray[np.int64]", "npt.NDArray[np.int64]",
                                    "npt.NDArray[np.int64]"]]]: ...  # (ts, keys, seqs)

class JoinSpec:
    op: int            # 1 SEQ, 2 AND
    window: int        # int64_t ms, -1: unbounded
    n_left: int        # idx_t
    n_right: int       # idx_t
    key_attrs: "npt.NDArray[np.int32]"
    preds: PredicateSet
    keyed: bool
    has_preds: bool
    def __init__(self, op: int, window: int, n_left: int, n_right: int,
                 key_attrs: "npt.ArrayLike", preds: PredicateSet) -> None: ...

class OnDemand:
    """A SEQ vertex's join bound to its input queues; its parent builds its records."""
    spec: JoinSpec
    left: KeyedQueue | None
    left_on_demand: "OnDemand | None"
    right: KeyedQueue
    evicted: int      # records its queues dropped during the parent's join
    def __init__(self, spec: JoinSpec, left: KeyedQueue | None,
                 left_on_demand: "OnDemand | None", right: KeyedQueue) -> None: ...
    def new_records(self, l_start: "npt.NDArray[np.int64]", l_end: "npt.NDArray[np.int64]",
                    l_key: "npt.NDArray[np.int64]", l_ids: "npt.NDArray[np.int64]",
                    r_start: "npt.NDArray[np.int64]", r_end: "npt.NDArray[np.int64]",
                    r_key: "npt.NDArray[np.int64]", r_ids: "npt.NDArray[np.int64]") -> None: ...

def join_delta(
    v: JoinSpec, st: EventStore, left: KeyedQueue | None, right: KeyedQueue | None,
    l_start: "npt.NDArray[np.int64]", l_end: "npt.NDArray[np.int64]",
    l_key: "npt.NDArray[np.int64]", l_ids: "npt.NDArray[np.int64]",
    r_start: "npt.NDArray[np.int64]", r_end: "npt.NDArray[np.int64]",
    r_key: "npt.NDArray[np.int64]", r_ids: "npt.NDArray[np.int64]",
    out: RingBuffer, lists: ListStore | None = None,
    left_on_demand: OnDemand | None = None,
) -> int: ...  # records the SEQ's left queue dropped (too old for its window)

class JoinPipeline:
    """A plan's EVENT vertices and the joins above them, run on a slice in one call."""
    leaves: LeafRouter
    leaf_vertices: tuple[int, ...]
    join_vertices: tuple[int, ...]   # topological order
    def __init__(self, leaves: LeafRouter, leaf_vertices: "Sequence[int]",
                 join_vertices: "Sequence[int]", specs: "Sequence[JoinSpec]",
                 left_inputs: "Sequence[int]",    # per join: leaf j as j, join m as
                 right_inputs: "Sequence[int]",   # n_leaves + m (m before it)
                 ) -> None: ...                   # ValueError on widths, order, lists
    def run(self, st: EventStore,
            seqs: "npt.NDArray[np.int64]", ts: "npt.NDArray[np.int64]",
            types: "npt.NDArray[np.int32]",
            left_queues: dict[int, KeyedQueue], right_queues: dict[int, KeyedQueue],
            rings: dict[int, RingBuffer],     # per join: its new records (emptied first)
            stats: dict[int, Any],            # per vertex: inputs, outputs, evictions, ns
            on_stop: "Callable[[int, Exception], Container[int]]",  # -> vertices stopped
            ) -> None: ...

class Guard:
    mode: int     # GUARD_MODES value
    n_host: int   # idx_t: slots of a host record the predicates read
    left_slots: "npt.NDArray[np.int64]"
    right_slots: "npt.NDArray[np.int64]"
    active_slots: "npt.NDArray[np.int64]"
    preds: PredicateSet
    window: int   # int64_t ms
    def __init__(self, mode: int, n_host: int, left_slots: "npt.ArrayLike",
                 right_slots: "npt.ArrayLike", active_slots: "npt.ArrayLike",
                 preds: PredicateSet, window: int) -> None: ...
    def keep(
        self, st: EventStore, negated: RingBuffer,
        starts: "npt.NDArray[np.int64]", ends: "npt.NDArray[np.int64]",
        recs: "npt.NDArray[np.int64]",  # const int64_t[:, ::1], shape (n, >= n_host)
        lists: ListStore | None = None,
    ) -> "npt.NDArray[np.bool_]": ...
    def drop_violated(self, st: EventStore, negated: RingBuffer, recs: RingBuffer,
                      lists: ListStore | None = None) -> int: ...  # in place; how many dropped
