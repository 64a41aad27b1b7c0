"""Compiled kernels (Cython). Declarations live in the .pxd files, bodies in the .pyx,
and each module has a .pyi stub for the Python-visible API."""
