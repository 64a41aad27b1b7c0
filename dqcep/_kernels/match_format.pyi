# Python-visible API of dqcep._kernels.match_format (C types in comments).
import numpy as np
import numpy.typing as npt

def format_matches(
    head: bytes,                       # b'{"query": <name>, "detected_at": '
    keys: list[bytes],                 # per variable: b'<variable>: ' (JSON)
    detected: "npt.NDArray[np.int64]",  # const int64_t[::1]
    ids: "npt.NDArray[np.int64]",       # const int64_t[:, ::1]; -1: unbound, left out
    list_of: "npt.ArrayLike | None" = None,  # int64 per variable: its list column, -1 none
    offsets: "npt.ArrayLike | None" = None,  # int64 [rows * list columns + 1]
    values: "npt.ArrayLike | None" = None,   # int64: the lists' ids, in ts order
    mid: bytes = b', "events": {',      # between the detection time and the events
    tail: bytes = b"}}\n",              # after them
    with_detected: bool = True,         # False: no detection time after head
) -> bytes: ...  # one line per match (the spec's JSON line by default)
