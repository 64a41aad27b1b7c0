# Python-visible API of dqcep._kernels.lists (C types in comments).
import numpy as np
import numpy.typing as npt

from dqcep._kernels.predicates import PredicateSet
from dqcep._kernels.ring import KeyedQueue, RingBuffer
from dqcep._kernels.store import EventStore, ListStore

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
