# Python-visible API of dqcep._kernels.lists (C types in comments).
import numpy as np
import numpy.typing as npt

from dqcep._kernels.operators import PredicateSet
from dqcep._kernels.ring import KeyedQueue, RingBuffer
from dqcep._kernels.store import EventStore

class ListStore:
    n_aggs: int        # idx_t: aggregated store columns
    evicted: int       # int64_t: handle of the oldest node kept
    offset: int        # int64_t: handle of row 0 of the node arrays
    size: int          # idx_t: nodes kept
    high_water: int    # idx_t: most nodes kept at once
    def __init__(self, agg_attrs: "npt.ArrayLike" = ()) -> None: ...  # int32 store columns
    def py_append(self, st: EventStore, parent: int, seq: int) -> int: ...
    def py_evict_end_before(self, cutoff: int) -> int: ...
    def info(self, handle: int) -> dict[str, int]: ...
    def elements(self, handle: int) -> "npt.NDArray[np.int64]": ...
    def aggregate(self, handle: int, k: int, func: str) -> float | int | None: ...
    @property
    def nbytes(self) -> int: ...

def kleene_step(
    lists: ListStore,
    st: EventStore,
    growing: KeyedQueue,
    window: int,                        # int64_t
    seqs: "npt.NDArray[np.int64]",      # const int64_t[::1], ts ascending
    ts: "npt.NDArray[np.int64]",        # const int64_t[::1]
    keys: "npt.NDArray[np.int64]",      # const int64_t[::1]
    pairs: PredicateSet,
    first: PredicateSet,
    whole: PredicateSet,
    whole_each: PredicateSet,
    whole_pairs: PredicateSet,
    out: RingBuffer,
) -> int: ...
