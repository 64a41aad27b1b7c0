# Python-visible API of dqcep._kernels.guards (C types in comments).
import numpy as np
import numpy.typing as npt

from dqcep._kernels.predicates import PredicateSet
from dqcep._kernels.ring import RingBuffer
from dqcep._kernels.store import EventStore, ListStore

GUARD_MODES: dict[str, int]  # the planner's guard modes ("GAP", ...) as kernel codes

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
