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
    ) -> int: ...  # sequence number of the first appended event
    def evict_before(self, cutoff: int) -> int: ...
    def __len__(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def ts_of(self, seqs: "npt.NDArray[np.int64]") -> "npt.NDArray[np.int64]": ...
    def ids_of(self, seqs: "npt.NDArray[np.int64]") -> "npt.NDArray[np.int64]": ...  # -1 stays -1
    def cell(self, seq: int, a: int) -> tuple[int, float]: ...  # (kind, value)
    def dump(
        self,
    ) -> tuple[
        "npt.NDArray[np.int64]", "npt.NDArray[np.int64]", "npt.NDArray[np.int64]",
        "npt.NDArray[np.float64]", "npt.NDArray[np.int8]",
    ]: ...  # (seqs, ts, ids, val, kind)
    def string_codes(self) -> "npt.NDArray[np.int64]": ...
    def load(self, base: int, ts: "npt.ArrayLike", ids: "npt.ArrayLike", val: "npt.ArrayLike",
             kind: "npt.ArrayLike") -> None: ...

def py_eval(
    st: EventStore,
    code: "npt.NDArray[np.int32]",   # const int32_t[:, ::1], shape (n, 3)
    cval: "npt.NDArray[np.float64]",  # const double[::1]
    ckind: "npt.NDArray[np.int8]",    # const int8_t[::1]
    slots: "npt.NDArray[np.int64]",   # const int64_t[::1]: the record's event sequence numbers
) -> bool: ...  # tests: one predicate on one record
