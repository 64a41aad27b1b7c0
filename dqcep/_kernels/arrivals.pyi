# Python-visible API of dqcep._kernels.arrivals.
import numpy as np
import numpy.typing as npt

class ArrivalIndex:
    def __init__(self, ids: "npt.NDArray[np.int64]",
                 arrival: "npt.NDArray[np.float64]") -> None: ...
    def latest(self, candidates: "npt.NDArray[np.int64]") -> "npt.NDArray[np.float64]": ...
