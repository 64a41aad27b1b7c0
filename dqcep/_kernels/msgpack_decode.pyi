# Python-visible API of dqcep._kernels.msgpack_decode (C types in comments).
import numpy as np
import numpy.typing as npt

TS_LIMIT: int  # largest |ts| a record may have

def record_end(data: bytes | "npt.NDArray[np.uint8]", pos: int) -> int: ...  # -1: malformed
def is_utf8(data: bytes) -> bool: ...

class BytesTable:
    n: int  # idx_t: keys held
    def __init__(self, hash_bits: int = 64) -> None: ...  # < 64 only in tests: shared hashes
    def __setitem__(self, key: bytes, value: int) -> None: ...  # int32_t value
    def __getitem__(self, key: bytes) -> int: ...               # KeyError when absent
    def __len__(self) -> int: ...

class ColumnDecoder:
    n_attrs: int  # idx_t
    rows: int     # idx_t: rows held, taken by take()
    def __init__(self, types: list[str], attrs: list[str], dictionary: object) -> None: ...
    def forget_strings(self) -> None: ...
    def decode(self, payload: bytes) -> int: ...  # rows added, -1: the validator must decide
    def decode_stream(self, data: bytes | "npt.NDArray[np.uint8]", pos: int,
                      max_rows: int) -> tuple[int, int, bool]: ...  # (next pos, records, stopped)
    def spans(self) -> "npt.NDArray[np.int64]": ...  # [rows, 2]
    def take(
        self,
    ) -> tuple[
        "npt.NDArray[np.int64]", "npt.NDArray[np.int64]", "npt.NDArray[np.int32]",
        "npt.NDArray[np.float64]", "npt.NDArray[np.int8]",
    ]: ...  # (ts, id, type, val, kind)
