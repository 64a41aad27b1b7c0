# Python-visible API of dqcep.generator._walk (C types in comments).
import numpy as np
import numpy.typing as npt

def reflected_walk(
    source: npt.NDArray[np.int32],  # const int32_t[::1]
    steps: npt.NDArray[np.float64], # const double[::1]
    state: npt.NDArray[np.float64], # double[::1], updated in place
    lo: npt.NDArray[np.float64],    # const double[::1], per source
    hi: npt.NDArray[np.float64],    # const double[::1], per source
) -> npt.NDArray[np.float64]: ...
