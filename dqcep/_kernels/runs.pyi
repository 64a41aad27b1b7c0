# Python-visible API of dqcep._kernels.runs (C types in comments).
import numpy as np
import numpy.typing as npt

from dqcep._kernels.predicates import PredicateSet
from dqcep._kernels.ring import RingBuffer
from dqcep._kernels.store import EventStore, ListStore

NEXT_MATCH: int
STRICT: int
PARTITION: int

class RunSpec:
    strategy: int
    window: int                         # int64_t, ms
    k: int                              # slots
    conds: PredicateSet
    def __init__(
        self,
        strategy: int,
        window: int,
        slot_type: "npt.ArrayLike",     # int32 per slot
        slot_kleene: "npt.ArrayLike",   # uint8 per slot
        conds: PredicateSet,
        slot_first: "npt.ArrayLike",    # int64 [k + 1]: conditions per slot, then whole-match
        key_cols: "npt.ArrayLike",      # int32 store columns of [attr]
    ) -> None: ...

class RunTable:
    k: int
    width: int
    live: int
    high_water: int
    def __init__(self, k: int) -> None: ...
    nbytes: int                         # the row block and the key table
    def evict_start_before(self, cutoff: int) -> int: ...
    def dump(self) -> "npt.NDArray[np.int64]": ...           # [live, width]
    def load(self, rows: "npt.NDArray[np.int64]") -> None: ...

def run_step(
    sp: RunSpec,
    runs: RunTable,
    st: EventStore,
    ls: ListStore,
    seqs: "npt.NDArray[np.int64]",      # const int64_t[::1], stream order (ts, id)
    ts: "npt.NDArray[np.int64]",        # const int64_t[::1]
    types: "npt.NDArray[np.int32]",     # const int32_t[::1], -1: a type no slot has
    keys: "npt.NDArray[np.int64]",      # const int64_t[::1]
    keyed: "npt.NDArray[np.uint8]",     # const uint8_t[::1]
    out: RingBuffer,
) -> int: ...
