# Python-visible API of dqcep._kernels.leaves (C types in comments).
import numpy as np
import numpy.typing as npt

from dqcep._kernels.predicates import PredicateSet
from dqcep._kernels.store import EventStore

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
