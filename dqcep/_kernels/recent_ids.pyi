# Python-visible API of dqcep._kernels.recent_ids (C types in comments).
import numpy as np
import numpy.typing as npt

class RecentIds:
    capacity: int  # idx_t: ids remembered at most
    size: int      # idx_t: ids remembered now
    def __init__(self, capacity: int) -> None: ...
    def admit(self, ids: "npt.NDArray[np.int64]") -> "npt.NDArray[np.bool_]": ...  # True: first seen
    def ids(self) -> "npt.NDArray[np.int64]": ...  # oldest first
    def __contains__(self, x: int) -> bool: ...
    def __len__(self) -> int: ...
