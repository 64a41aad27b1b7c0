# Python-visible API of dqcep._kernels.sase (C types in comments).
import numpy as np
import numpy.typing as npt

from dqcep._kernels.predicates import PredicateSet
from dqcep._kernels.store import EventStore, ListStore

NEG_MODES: dict[str, int]
STRATEGIES: dict[str, int]   # the language's strategy names -> SaseRunNFA codes

class SaseAutomaton:
    n: int            # idx_t: positive states (a Kleene item is one)
    m: int            # idx_t: negated event types
    window: int       # int64_t ms
    pruned: int       # instances / runs dropped by the window
    live_peak: int    # most alive at once
    lists: ListStore | None  # the Kleene states' lists (SaseRunNFA)
    def release(self, st: EventStore, wm: int | None, everything: bool = False) -> None: ...  # take() them
    def held_min_start(self, st: EventStore) -> int | None: ...
    def take(self) -> tuple["npt.NDArray[np.int64]", "npt.NDArray[np.int64]"]: ...
    @property
    def partitions(self) -> int: ...

class SaseNFA(SaseAutomaton):
    pushed: int       # instances pushed onto the stacks
    constructed: int  # sequences built (before negation checks)
    def __init__(self, window: int, state_types: "npt.ArrayLike", neg_types: "npt.ArrayLike",
                 neg_modes: "npt.ArrayLike", neg_after: "npt.ArrayLike",
                 key_attrs: "npt.ArrayLike", scan_preds: PredicateSet,
                 build_preds: PredicateSet, ranges: "npt.ArrayLike") -> None: ...
    def scan(self, st: EventStore, seqs: "npt.NDArray[np.int64]",
             types: "npt.NDArray[np.int32]") -> None: ...
    def prune(self, cutoff: int, neg_cutoff: int) -> None: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def instances(self) -> int: ...

class SaseRunNFA(SaseAutomaton):
    strategy: int     # STRATEGIES
    started: int      # runs begun
    forked: int       # runs cloned (a non-deterministic edge)
    def __init__(self, strategy: int, window: int, state_types: "npt.ArrayLike",
                 state_lists: "npt.ArrayLike", neg_types: "npt.ArrayLike",
                 neg_modes: "npt.ArrayLike", neg_after: "npt.ArrayLike",
                 key_attrs: "npt.ArrayLike", scan_preds: PredicateSet, conds: PredicateSet,
                 ranges: "npt.ArrayLike", list_aggs: "npt.ArrayLike") -> None: ...
    def scan(self, st: EventStore, seqs: "npt.NDArray[np.int64]",
             types: "npt.NDArray[np.int32]") -> None: ...  # in stream order (ts, id)
    def prune(self, cutoff: int, neg_cutoff: int, list_cutoff: int) -> None: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def runs(self) -> int: ...
