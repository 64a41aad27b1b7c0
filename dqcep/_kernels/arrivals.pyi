# Python-visible API of dqcep._kernels.arrivals.
import numpy as np
import numpy.typing as npt

def latest_arrivals(ids: "npt.NDArray[np.int64]", arrival: "npt.NDArray[np.float64]",
                    candidates: "npt.NDArray[np.int64]") -> "npt.NDArray[np.float64]": ...
