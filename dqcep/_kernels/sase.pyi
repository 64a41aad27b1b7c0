# Python-visible API of dqcep._kernels.sase (C types in comments).
import numpy as np
import numpy.typing as npt

from dqcep._kernels.operators import PredicateSet
from dqcep._kernels.store import EventStore

NEG_MODES: dict[str, int]

class SaseNFA:
    n: int            # idx_t: positive states
    m: int            # idx_t: negated event types
    window: int       # int64_t ms
    pushed: int       # instances pushed onto the stacks
    pruned: int       # instances dropped by window pruning
    constructed: int  # sequences built (before negation checks)
    live_peak: int    # most instances alive at once
    def __init__(self, window: int, state_types: "npt.ArrayLike", neg_types: "npt.ArrayLike",
                 neg_modes: "npt.ArrayLike", neg_after: "npt.ArrayLike",
                 key_attrs: "npt.ArrayLike", scan_preds: PredicateSet,
                 build_preds: PredicateSet, ranges: "npt.ArrayLike") -> None: ...
    def scan(self, st: EventStore, seqs: "npt.NDArray[np.int64]",
             types: "npt.NDArray[np.int32]") -> None: ...
    def release(self, st: EventStore, wm: int | None, everything: bool = False) -> None: ...  # take() them
    def prune(self, cutoff: int, neg_cutoff: int) -> None: ...
    def held_min_start(self, st: EventStore) -> int | None: ...
    def take(self) -> tuple["npt.NDArray[np.int64]", "npt.NDArray[np.int64]"]: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def instances(self) -> int: ...
    @property
    def partitions(self) -> int: ...
    @property
    def held_count(self) -> int: ...
