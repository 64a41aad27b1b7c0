# The one checked allocator of every growing kernel buffer (as scikit-learn's
# _utils.pxd safe_realloc): on failure the old block stays valid and owned by the
# caller, and MemoryError says how much was asked for.
from libc.stdlib cimport realloc


cdef inline void* grow(void* block, size_t nbytes) except NULL nogil:
    """``realloc(block, nbytes)``; raises MemoryError and leaves ``block`` as it was
    when that fails (plain ``p = realloc(p, n)`` loses the block on failure)."""
    cdef void* out = realloc(block, nbytes if nbytes else 1)
    if out == NULL:
        with gil:
            raise MemoryError(f"could not allocate {nbytes} bytes")
    return out
