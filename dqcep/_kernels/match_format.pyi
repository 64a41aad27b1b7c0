# Python-visible API of dqcep._kernels.match_format (C types in comments).
import numpy as np
import numpy.typing as npt

def format_matches(
    head: bytes,                       # b'{"query": <name>, "detected_at": '
    keys: list[bytes],                 # per variable: b'<variable>: ' (JSON)
    detected: "npt.NDArray[np.int64]",  # const int64_t[::1]
    ids: "npt.NDArray[np.int64]",       # const int64_t[:, ::1]; -1: unbound, left out
) -> bytes: ...  # one JSON line per match
