# Python-visible API of dqcep._kernels.msgpack_encode (C types in comments).
import numpy as np
import numpy.typing as npt

def encode_payloads(
    ids: npt.NDArray[np.int64],          # const int64_t[::1]
    ts: npt.NDArray[np.int64],           # const int64_t[::1]
    types: npt.NDArray[np.int32],        # const int32_t[::1]
    malformed: npt.NDArray[np.int8],     # const int8_t[::1]
    kinds: npt.NDArray[np.int8],         # const int8_t[::1], per attribute
    column_index: npt.NDArray[np.int64], # const int64_t[::1], per attribute
    floats: npt.NDArray[np.float64],     # const double[:, ::1]
    ints: npt.NDArray[np.int64],         # const int64_t[:, ::1]
    strs: npt.NDArray[np.int32],         # const int32_t[:, ::1]
    bools: npt.NDArray[np.int8],         # const int8_t[:, ::1]
    dict_base: npt.NDArray[np.int64],    # const int64_t[::1], per attribute
    blob: npt.NDArray[np.uint8],         # const uint8_t[::1]
    offsets: npt.NDArray[np.int64],      # const int64_t[::1]
    n_types: int,                        # idx_t
    batch_size: int,                     # idx_t
    out: npt.NDArray[np.uint8],          # uint8_t[::1]
) -> tuple[int, npt.NDArray[np.int64]]: ...
