"""Build the Cython kernels; all metadata lives in pyproject.toml.

The .pyx sources are cythonized at build time (generated C is never committed).
Set DQCEP_DEBUG_CYTHON=1 to build with bounds and wraparound checks on (and debug info).
"""
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("DQCEP_DEBUG_CYTHON", "") not in ("", "0")

DIRECTIVES = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "embedsignature": True,
}

KERNELS = ["ring", "store", "operators", "lists", "runs", "chains", "msgpack_encode", "msgpack_decode", "recent_ids",
           "match_format", "walk", "sase"]

extensions = [
    Extension(
        f"dqcep._kernels.{name}",
        [f"dqcep/_kernels/{name}.pyx"],
        include_dirs=[numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        # No debug info (Python's CFLAGS have -g) unless DQCEP_DEBUG_CYTHON: a quarter of
        # the compile time and 7x smaller objects (operators: 18.4 s, 6.6 MB -> 13.4 s,
        # 0.9 MB); every install and the tests' wheel build compile all kernels.
        extra_compile_args=[] if DEBUG else ["-g0"],
    )
    for name in KERNELS
]

# The kernels compile in parallel, one per core: the install (and the tests' wheel
# build) took ~80 s on 2 cores one after the other.
setup(ext_modules=cythonize(extensions, compiler_directives=DIRECTIVES,
                            nthreads=os.cpu_count() or 1),
      options={"build_ext": {"parallel": os.cpu_count() or 1}})
