# The most recent distinct event ids, for dropping events delivered twice.
from libc.stdint cimport int64_t, uint8_t

from dqcep._kernels._types cimport idx_t, id_t


cdef class RecentIds:
    cdef readonly idx_t capacity   # ids remembered at most
    cdef id_t* fifo                # arrival order: fifo[(head + k) % capacity]
    cdef idx_t head
    cdef readonly idx_t size
    cdef id_t* keys                # open-addressing set, linear probing
    cdef uint8_t* used
    cdef idx_t mask                # table size - 1 (a power of two >= 2 * capacity)

    cdef bint contains(self, id_t x) noexcept nogil
    cdef void insert(self, id_t x) noexcept nogil
    cdef void remove(self, id_t x) noexcept nogil
    cdef bint admit_one(self, id_t x) noexcept nogil
