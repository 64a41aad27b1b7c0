# Python-visible API of dqcep._kernels.joins (C types in comments).
from typing import Any, Callable, Container, Sequence

import numpy as np
import numpy.typing as npt

from dqcep._kernels.leaves import LeafRouter
from dqcep._kernels.predicates import PredicateSet
from dqcep._kernels.ring import KeyedQueue, RingBuffer
from dqcep._kernels.store import EventStore, ListStore

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
