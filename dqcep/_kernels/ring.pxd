# Circular queue of partial-match records: the per-operand input queue of an
# operator processor (DQCEP's "circular processing queue").
from libc.stdint cimport int64_t, uint64_t

from dqcep._kernels._table cimport Int64Slot, Int64Table
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
    cdef public idx_t limit           # records it may hold, at most (0: no limit): the
                                      # per-query budget; growing past it raises
                                      # StateBudgetExceeded

    cdef int _resize(self, idx_t new_capacity) except -1 nogil
    cdef int reserve(self, idx_t extra) except -1 nogil
    cdef int shrink_if_sparse(self) except -1 nogil
    cdef int64_t* row(self, idx_t i) noexcept nogil
    cdef int push_row(self, ts_t start, ts_t end, int64_t key, const id_t* ids) except -1 nogil
    cdef idx_t drop_front(self, idx_t n) noexcept nogil
    cdef idx_t count_start_before(self, ts_t cutoff) noexcept nogil


cdef class KeyedQueue:
    """A RingBuffer of records sorted by end ts, with per-key chains (a hash index).

    Each record gets one extra word after its ids: the logical position of the
    previous record with the same key (-1: none). Logical positions count every
    record ever appended; ``evicted`` of them have left from the head.
    """
    cdef readonly RingBuffer records   # n_ids + 1 words of ids: the last is the chain link
    cdef readonly idx_t n_ids          # event-id slots per record
    cdef readonly int64_t evicted      # logical position of the head record
    cdef Int64Table index              # key -> logical position of its newest record
                                       # (entries of keys with no live record go stale)

    cdef int64_t tail_pos(self) noexcept nogil
    cdef int64_t* at(self, int64_t pos) noexcept nogil
    cdef int64_t newest_with_key(self, int64_t key) noexcept nogil
    cdef int64_t older_with_key(self, int64_t pos) noexcept nogil
    cdef int append(self, ts_t start, ts_t end, int64_t key, const id_t* ids) except -1 nogil
    cdef int _rebuild(self, idx_t capacity) except -1 nogil
    cdef idx_t evict_end_before(self, ts_t cutoff) except -1 nogil


cdef idx_t first_end_after(RingBuffer ring, ts_t t, bint inclusive) noexcept nogil


# Inline accessors for hot loops in other modules (bodies here so they inline there).

cdef inline int64_t* ring_row(RingBuffer r, idx_t i) noexcept nogil:
    return r.data + ((r.head + i) & r.mask) * r.width


cdef inline int64_t* kq_at(KeyedQueue q, int64_t pos) noexcept nogil:
    return ring_row(q.records, <idx_t>(pos - q.evicted))


cdef inline int64_t kq_older(KeyedQueue q, int64_t pos) noexcept nogil:
    cdef int64_t prev = kq_at(q, pos)[COL_IDS + q.n_ids]
    return prev if prev >= q.evicted else -1


cdef inline int64_t* ring_push(RingBuffer r) except NULL nogil:
    """Room for one more record at the tail; the caller fills all its words."""
    cdef int64_t* row
    if r.size == r.capacity:
        r.reserve(1)
    row = ring_row(r, r.size)
    r.size += 1
    if r.size > r.high_water:
        r.high_water = r.size
    return row
