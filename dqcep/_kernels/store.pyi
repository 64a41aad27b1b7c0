# Python-visible API of dqcep._kernels.store (C types in comments).
import numpy as np
import numpy.typing as npt

OPCODES: dict[str, int]  # bytecode opcodes by name; dqcep.plan.bytecode.Op is built from it
KINDS: dict[str, int]    # cell kinds (MISSING/NUM/STR/BOOL), pseudo-columns ATTR_TS/ATTR_ID, MAX_STACK

class EventStore:
    n_attrs: int     # idx_t: attribute columns
    base: int        # int64_t: sequence number of the oldest stored event
    next_seq: int    # int64_t: sequence number the next event gets
    high_water: int  # idx_t: most events held at once
    def __init__(self, n_attrs: int) -> None: ...
    def append(
        self,
        ts: "npt.NDArray[np.int64]",     # const int64_t[::1]
        ids: "npt.NDArray[np.int64]",    # const int64_t[::1]
        val: "npt.NDArray[np.float64]",  # const double[:, ::1], shape (n, n_attrs)
        kind: "npt.NDArray[np.int8]",    # const int8_t[:, ::1], shape (n, n_attrs)
        types: "npt.NDArray[np.int32] | None" = None,  # const int32_t[::1]; None: -1
    ) -> int: ...  # sequence number of the first appended event
    def evict_before(self, cutoff: int) -> int: ...
    def __len__(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def ts_of(self, seqs: "npt.NDArray[np.int64]") -> "npt.NDArray[np.int64]": ...
    def types_of(self, seqs: "npt.NDArray[np.int64]") -> "npt.NDArray[np.int32]": ...  # -1: not given
    def ids_of(self, seqs: "npt.NDArray[np.int64]") -> "npt.NDArray[np.int64]": ...  # -1 stays -1
    def cell(self, seq: int, a: int) -> tuple[int, float]: ...  # (kind, value)
    def dump(
        self,
    ) -> tuple[
        "npt.NDArray[np.int64]", "npt.NDArray[np.int64]", "npt.NDArray[np.int64]",
        "npt.NDArray[np.float64]", "npt.NDArray[np.int8]", "npt.NDArray[np.int32]",
    ]: ...  # (seqs, ts, ids, val, kind, types)
    def string_codes(self) -> "npt.NDArray[np.int64]": ...
    def load(self, base: int, ts: "npt.ArrayLike", ids: "npt.ArrayLike", val: "npt.ArrayLike",
             kind: "npt.ArrayLike", types: "npt.ArrayLike | None" = None) -> None: ...

def py_eval(
    st: EventStore,
    code: "npt.NDArray[np.int32]",   # const int32_t[:, ::1], shape (n, 3)
    cval: "npt.NDArray[np.float64]",  # const double[::1]
    ckind: "npt.NDArray[np.int8]",    # const int8_t[::1]
    slots: "npt.NDArray[np.int64]",   # const int64_t[::1]: the record's event sequence numbers
) -> bool: ...  # tests: one predicate on one record

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
    def elements_of(
        self, handles: "npt.NDArray[np.int64]"  # const int64_t[::1]
    ) -> tuple["npt.NDArray[np.int64]", "npt.NDArray[np.int64]"]: ...
    def aggregate(self, handle: int, k: int, func: str) -> float | int | None: ...
    def dump(self) -> tuple: ...  # (evicted, seq, parent, count, first, start, end, agg, ok)
    def load(self, evicted: int, seq, parent, count, first, start, end, agg, ok) -> None: ...
    @property
    def nbytes(self) -> int: ...
