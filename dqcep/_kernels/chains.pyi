# Python-visible API of dqcep._kernels.chains (C types in comments).
import numpy as np
import numpy.typing as npt

from dqcep._kernels.predicates import PredicateSet
from dqcep._kernels.ring import RingBuffer
from dqcep._kernels.store import EventStore, ListStore

CHAIN_SLOTS: int  # the most slots a chain has

class ChainSpec:
    window: int                         # int64_t, ms
    k: int                              # slots
    conds: PredicateSet
    def __init__(
        self,
        window: int,
        slot_type: "npt.ArrayLike",     # int32 per slot
        slot_kleene: "npt.ArrayLike",   # uint8 per slot
        conds: PredicateSet,
        group_first: "npt.ArrayLike",   # int64 [3 k + 2]: per slot filter, bind, iteration; whole
        key_cols: "npt.ArrayLike",      # int32 store columns of [attr]
    ) -> None: ...

class ChainStacks:
    k: int
    live: int                           # events stacked
    high_water: int
    def __init__(self, k: int, kleene: "npt.ArrayLike | None" = None) -> None: ...  # per slot
    nbytes: int                         # the stacks and the partition table
    def evict_start_before(self, cutoff: int) -> int: ...
    def dump(self) -> "npt.NDArray[np.int64]": ...           # [live, 4]: key, slot, seq, ts
    def load(self, rows: "npt.NDArray[np.int64]") -> None: ...

def chain_step_ids(
    sp: ChainSpec,
    stacks: ChainStacks,
    st: EventStore,
    ls: ListStore,
    seqs: "npt.NDArray[np.int64]",
    ts: "npt.NDArray[np.int64]",
    types: "npt.NDArray[np.int32]",
    keys: "npt.NDArray[np.int64]",
    keyed: "npt.NDArray[np.uint8]",
    var_slots: "npt.NDArray[np.int64]",  # const int64_t[::1]: plain slots
    limit: int,                          # matches at most (0: no limit)
) -> "tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]": ...  # detected[n], ids[n, m]

def chain_step(
    sp: ChainSpec,
    stacks: ChainStacks,
    st: EventStore,
    ls: ListStore,
    seqs: "npt.NDArray[np.int64]",      # const int64_t[::1], in ts order
    ts: "npt.NDArray[np.int64]",        # const int64_t[::1]
    types: "npt.NDArray[np.int32]",     # const int32_t[::1], -1: a type no slot has
    keys: "npt.NDArray[np.int64]",      # const int64_t[::1]
    keyed: "npt.NDArray[np.uint8]",     # const uint8_t[::1]
    out: RingBuffer,
) -> int: ...

def match_ids(
    out: RingBuffer,
    st: EventStore,
    var_slots: "npt.NDArray[np.int64]",  # const int64_t[::1]
) -> "tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]": ...  # detected[n], ids[n, m]
