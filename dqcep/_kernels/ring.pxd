# Circular queue of partial-match records: the per-operand input queue of an
# operator processor (DQCEP's "circular processing queue").
from libc.stdint cimport int64_t

from dqcep._kernels._types cimport idx_t, id_t, ts_t

# Word offsets inside one record. A record is `width` int64 words, row-major.
cdef enum:
    COL_START = 0  # min ts over the record's events
    COL_END = 1    # max ts over the record's events
    COL_KEY = 2    # partition key (equivalence / equality index), 0 when unused
    COL_IDS = 3    # first event-id slot; n_ids slots follow


cdef class RingBuffer:
    cdef int64_t* data                # capacity * width words; owned, freed in __dealloc__
    cdef readonly idx_t n_ids         # event-id slots per record
    cdef readonly idx_t width         # words per record: COL_IDS + n_ids
    cdef idx_t head                   # physical row of the oldest record
    cdef idx_t size                   # records held
    cdef readonly idx_t capacity      # rows allocated; always a power of two
    cdef idx_t mask                   # capacity - 1, turns a logical index into a row
    cdef readonly idx_t min_capacity  # shrinking never goes below this
    cdef readonly idx_t high_water    # largest size ever held (for --stats)

    cdef int _resize(self, idx_t new_capacity) except -1 nogil
    cdef int reserve(self, idx_t extra) except -1 nogil
    cdef int shrink_if_sparse(self) except -1 nogil
    cdef int64_t* row(self, idx_t i) noexcept nogil
    cdef int push_row(self, ts_t start, ts_t end, int64_t key, const id_t* ids) except -1 nogil
    cdef idx_t drop_front(self, idx_t n) noexcept nogil
    cdef idx_t count_start_before(self, ts_t cutoff) noexcept nogil
