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

class MatchLines:
    n: int  # rows
    def __init__(
        self,
        head: bytes,
        keys: list[bytes],
        detected: "npt.NDArray[np.int64]",
        ids: "npt.NDArray[np.int64]",
        list_of: "npt.ArrayLike | None" = None,
        offsets: "npt.ArrayLike | None" = None,
        values: "npt.ArrayLike | None" = None,
        mid: bytes = b', "events": {',
        tail: bytes = b"}}\n",
        with_detected: bool = True,
    ) -> None: ...  # as format_matches, checked once
    def all(self) -> bytes: ...  # every row's line
    def write_to(
        self, fd: int, buffer: "npt.NDArray[np.uint8]"  # uint8_t[::1]; a longer line
    ) -> int: ...  # gets its own; every line written to fd without the GIL; bytes
    @property
    def longest(self) -> int: ...  # the most bytes one row's line can take
