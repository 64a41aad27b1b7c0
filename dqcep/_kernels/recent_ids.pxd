# The most recent distinct event ids, for dropping events delivered twice.
from libc.stdint cimport int64_t

from dqcep._kernels._table cimport Int64Table
from dqcep._kernels._types cimport idx_t, id_t


cdef class RecentIds:
    cdef readonly idx_t capacity   # ids remembered at most
    cdef id_t* fifo                # arrival order: fifo[(head + k) % capacity]
    cdef idx_t head
    cdef readonly idx_t size
    cdef Int64Table held           # the ids in the fifo, as a set (value 0); >= 2 * capacity slots

    cdef bint admit_one(self, id_t x) noexcept nogil
