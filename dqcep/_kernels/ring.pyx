"""Circular queue of partial-match records.

Each operand of an operator processor holds one RingBuffer. A record is a fixed
row of int64 words: start ts, end ts, partition key, then ``n_ids`` event-id
slots (the events bound so far, in the operand's variable order). Records are
appended at the tail and evicted from the head as the watermark passes, so the
buffer holds what the window needs, never the stream.

The buffer is a power-of-two array indexed with a mask. It doubles when full and
halves when a quarter full (never below ``min_capacity``), so its size follows
the window contents both ways.
"""
from libc.stdint cimport int64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

import numpy as np

from dqcep._kernels._table cimport table_free, table_get, table_init, table_set
from dqcep._kernels._types cimport idx_t, id_t, ts_t

DEF_MIN_CAPACITY = 16


class StateBudgetExceeded(Exception):
    """A buffer would grow past its ``limit`` (records): the state of the query that
    fills it exceeds its budget. Raised before any memory is asked for; the buffer
    holds what it held."""


cdef inline idx_t next_pow2(idx_t n) noexcept nogil:
    cdef idx_t p = 1
    while p < n:
        p <<= 1
    return p


cdef class RingBuffer:
    """RingBuffer(n_ids, min_capacity=16)

    A FIFO of partial-match records with ``n_ids`` event-id slots each.
    """

    def __cinit__(self, idx_t n_ids, idx_t min_capacity=DEF_MIN_CAPACITY):
        self.data = NULL
        if n_ids < 0:
            raise ValueError(f"n_ids must be >= 0, got {n_ids}")
        if min_capacity < 1:
            raise ValueError(f"min_capacity must be >= 1, got {min_capacity}")
        self.n_ids = n_ids
        self.width = COL_IDS + n_ids
        self.min_capacity = next_pow2(min_capacity)
        self.head = 0
        self.size = 0
        self.high_water = 0
        self.capacity = 0
        self.mask = 0
        self._resize(self.min_capacity)

    def __dealloc__(self):
        free(self.data)

    # ------------------------------------------------------------------ C API

    cdef int _resize(self, idx_t new_capacity) except -1 nogil:
        """Move the records into a fresh zeroed array of new_capacity rows."""
        cdef size_t row_bytes = <size_t>self.width * sizeof(int64_t)
        cdef int64_t* fresh
        cdef idx_t i
        if new_capacity < self.size:
            with gil:
                raise AssertionError("resize below the number of records held")
        if <size_t>new_capacity > (<size_t>-1) / row_bytes:
            with gil:
                raise MemoryError(
                    f"ring buffer of {new_capacity} records x {row_bytes} bytes overflows size_t")
        fresh = <int64_t*>calloc(<size_t>new_capacity, row_bytes)
        if fresh == NULL:
            with gil:
                raise MemoryError(
                    f"could not allocate {new_capacity * row_bytes} bytes for a ring buffer")
        for i in range(self.size):
            memcpy(fresh + i * self.width, self.row(i), row_bytes)
        free(self.data)
        self.data = fresh
        self.head = 0
        self.capacity = new_capacity
        self.mask = new_capacity - 1
        return 0

    cdef int reserve(self, idx_t extra) except -1 nogil:
        """Make room for ``extra`` more records (doubling)."""
        cdef idx_t need = self.size + extra
        if need <= self.capacity:
            return 0
        if self.limit > 0 and need > self.limit:
            with gil:
                raise StateBudgetExceeded(f"{need} records, the budget is {self.limit}")
        return self._resize(next_pow2(need))

    cdef int shrink_if_sparse(self) except -1 nogil:
        """Halve the array while it is at most a quarter full."""
        cdef idx_t target = self.capacity
        while target > self.min_capacity and self.size <= target // 4:
            target //= 2
        if target != self.capacity:
            return self._resize(target)
        return 0

    cdef inline int64_t* row(self, idx_t i) noexcept nogil:
        """Pointer to the i-th record from the head (no bounds check)."""
        return self.data + ((self.head + i) & self.mask) * self.width

    cdef int push_row(self, ts_t start, ts_t end, int64_t key, const id_t* ids) except -1 nogil:
        cdef int64_t* r
        cdef idx_t j
        if self.size == self.capacity:
            self.reserve(1)
        r = self.row(self.size)
        r[COL_START] = start
        r[COL_END] = end
        r[COL_KEY] = key
        for j in range(self.n_ids):
            r[COL_IDS + j] = ids[j]
        self.size += 1
        if self.size > self.high_water:
            self.high_water = self.size
        return 0

    cdef idx_t drop_front(self, idx_t n) noexcept nogil:
        """Drop up to n records from the head; return how many were dropped."""
        if n > self.size:
            n = self.size
        self.head = (self.head + n) & self.mask
        self.size -= n
        return n

    cdef idx_t count_start_before(self, ts_t cutoff) noexcept nogil:
        """Length of the head run of records whose start ts is < cutoff."""
        cdef idx_t n = 0
        while n < self.size and self.row(n)[COL_START] < cutoff:
            n += 1
        return n

    # ------------------------------------------------------------- Python API

    def __len__(self):
        return self.size

    @property
    def nbytes(self):
        """Bytes held by the record array (capacity, not size)."""
        return self.capacity * self.width * sizeof(int64_t)

    def push(self, ts_t start, ts_t end, int64_t key, ids):
        """Append one record; ``ids`` is a sequence of n_ids integers."""
        cdef id_t[::1] buf = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if buf.shape[0] != self.n_ids:
            raise ValueError(f"expected {self.n_ids} event ids, got {buf.shape[0]}")
        if self.n_ids:
            self.push_row(start, end, key, &buf[0])
        else:
            self.push_row(start, end, key, NULL)

    def push_batch(self, const ts_t[::1] starts, const ts_t[::1] ends,
                   const int64_t[::1] keys, const id_t[:, ::1] ids):
        """Append n records from contiguous int64 arrays; ids has shape (n, n_ids)."""
        cdef idx_t n = starts.shape[0]
        cdef idx_t i
        if ends.shape[0] != n or keys.shape[0] != n or ids.shape[0] != n:
            raise ValueError(
                f"push_batch arrays disagree in length: starts={n}, ends={ends.shape[0]}, "
                f"keys={keys.shape[0]}, ids={ids.shape[0]}")
        if ids.shape[1] != self.n_ids:
            raise ValueError(f"ids must have {self.n_ids} columns, got {ids.shape[1]}")
        if n == 0:
            return
        with nogil:
            self.reserve(n)
            for i in range(n):
                self.push_row(starts[i], ends[i], keys[i], &ids[i, 0] if self.n_ids else NULL)

    def pop(self, idx_t n=1):
        """Drop up to n records from the head; return how many were dropped."""
        if n < 0:
            raise ValueError(f"cannot pop a negative count ({n})")
        cdef idx_t dropped = self.drop_front(n)
        self.shrink_if_sparse()
        return dropped

    def evict_before(self, ts_t cutoff):
        """Drop the head run of records with start ts < cutoff; return the count.

        Eviction stops at the first record that is still inside the window, so
        it is exact when records arrive in start order (the router guarantees
        that for each queue) and conservative otherwise.
        """
        cdef idx_t n
        with nogil:
            n = self.drop_front(self.count_start_before(cutoff))
            self.shrink_if_sparse()
        return n

    def clear(self):
        self.drop_front(self.size)
        self.shrink_if_sparse()

    def reset(self):
        """Drop every record but keep the capacity (a scratch buffer reused per batch)."""
        self.head = 0
        self.size = 0

    def __getitem__(self, idx_t i):
        """(start, end, key, ids) of the i-th record from the head."""
        if i < 0:
            i += self.size
        if i < 0 or i >= self.size:
            raise IndexError(f"record {i} out of range for a ring of {self.size}")
        cdef int64_t* r = self.row(i)
        return (r[COL_START], r[COL_END], r[COL_KEY],
                tuple(r[COL_IDS + j] for j in range(self.n_ids)))

    def to_arrays(self, idx_t n_ids=-1):
        """Copies (starts, ends, keys, ids[n, n_ids]) in head-to-tail order.

        ``n_ids`` < the record's slots returns only the first ones.
        """
        if n_ids < 0 or n_ids > self.n_ids:
            n_ids = self.n_ids
        cdef idx_t n = self.size, i, j
        # one block for the four (the engine takes a join's new records every slice
        # of events: one allocation and one buffer, not four)
        block = np.empty(n * (3 + n_ids), dtype=np.int64)
        cdef int64_t[::1] out = block
        cdef int64_t* r
        with nogil:
            for i in range(n):
                r = self.row(i)
                out[i], out[n + i], out[2 * n + i] = r[COL_START], r[COL_END], r[COL_KEY]
                for j in range(n_ids):  # a few words: a loop, not a memcpy call per row
                    out[3 * n + i * n_ids + j] = r[COL_IDS + j]
        return block[:n], block[n:2 * n], block[2 * n:3 * n], \
            block[3 * n:].reshape(n, n_ids)


# ---------------------------------------------------------------------------
# KeyedQueue: the input queue of a binary operator, with a hash index on the key

cdef class KeyedQueue:
    """KeyedQueue(n_ids)

    Records (start, end, key, ids) appended in end-ts order; ``newest_with_key``
    and ``older_with_key`` walk the records of one key from newest to oldest
    without scanning the others. Eviction drops head records whose end ts is
    before a cutoff; stale table entries are swept when they outnumber live ones.
    """

    def __cinit__(self, idx_t n_ids):
        self.records = RingBuffer(n_ids + 1)
        self.n_ids = n_ids
        self.evicted = 0
        self._rebuild(16)

    def __dealloc__(self):
        table_free(&self.index)

    cdef inline int64_t tail_pos(self) noexcept nogil:
        return self.evicted + self.records.size

    cdef inline int64_t* at(self, int64_t pos) noexcept nogil:
        return self.records.row(pos - self.evicted)

    cdef int64_t newest_with_key(self, int64_t key) noexcept nogil:
        cdef int64_t pos = table_get(&self.index, key)
        return pos if pos >= self.evicted else -1

    cdef inline int64_t older_with_key(self, int64_t pos) noexcept nogil:
        cdef int64_t prev = self.at(pos)[COL_IDS + self.n_ids]
        return prev if prev >= self.evicted else -1

    cdef int _rebuild(self, idx_t capacity) except -1 nogil:
        """A fresh index holding the newest live position of every live key."""
        cdef Int64Table fresh
        cdef int64_t p
        table_init(&fresh, capacity)
        table_free(&self.index)
        self.index = fresh
        for p in range(self.evicted, self.tail_pos()):   # oldest first: newest wins
            table_set(&self.index, self.at(p)[COL_KEY], p)
        return 0

    cdef int append(self, ts_t start, ts_t end, int64_t key, const id_t* ids) except -1 nogil:
        cdef int64_t pos = self.tail_pos()
        cdef int64_t* r
        cdef idx_t j
        if 2 * (self.index.used + 1) > self.index.mask + 1:   # sweep stale keys, then size
            self._rebuild(max(16, next_pow2(4 * (self.records.size + 1))))
        self.records.reserve(1)
        r = self.records.row(self.records.size)
        r[COL_START] = start
        r[COL_END] = end
        r[COL_KEY] = key
        for j in range(self.n_ids):
            r[COL_IDS + j] = ids[j]
        r[COL_IDS + self.n_ids] = self.newest_with_key(key)  # the chain link
        self.records.size += 1
        if self.records.size > self.records.high_water:
            self.records.high_water = self.records.size
        table_set(&self.index, key, pos)
        return 0

    cdef idx_t evict_end_before(self, ts_t cutoff) except -1 nogil:
        cdef idx_t n = 0
        while n < self.records.size and self.records.row(n)[COL_END] < cutoff:
            n += 1
        if n == 0:
            return 0  # (called for every record a SEQ appends: the common case is cheap)
        self.records.drop_front(n)
        self.evicted += n
        self.records.shrink_if_sparse()
        if self.index.used > 64 and self.index.used > 4 * (self.records.size + 1):
            self._rebuild(max(16, next_pow2(4 * (self.records.size + 1))))
        return n

    # Python API (tests, introspection) -----------------------------------
    def __len__(self):
        return self.records.size

    def push_batch(self, const ts_t[::1] starts, const ts_t[::1] ends,
                   const int64_t[::1] keys, const id_t[:, ::1] ids):
        """Append n records (in end-ts order) from contiguous arrays; ids (n, n_ids)."""
        cdef idx_t n = starts.shape[0], i
        if ends.shape[0] != n or keys.shape[0] != n or ids.shape[0] != n or \
                (n and ids.shape[1] != self.n_ids):
            raise ValueError(f"push_batch: {n} records with {self.n_ids} ids each expected")
        with nogil:
            for i in range(n):
                self.append(starts[i], ends[i], keys[i], &ids[i, 0])

    def py_append(self, ts_t start, ts_t end, int64_t key, ids):
        cdef id_t[::1] buf = np.ascontiguousarray(list(ids) + [0], dtype=np.int64)
        if buf.shape[0] != self.n_ids + 1:
            raise ValueError(f"expected {self.n_ids} event ids, got {buf.shape[0] - 1}")
        self.append(start, end, key, &buf[0])

    def load(self, int64_t evicted, const int64_t[::1] starts, const int64_t[::1] ends,
             const int64_t[::1] keys, const int64_t[:, ::1] ids):
        """Fill an empty queue from a snapshot's arrays (logical positions from
        ``evicted``), in one nogil pass: the restore of a queue costs its records."""
        cdef idx_t n = starts.shape[0], i, j
        if self.records.size:
            raise ValueError("load needs an empty queue")
        if ends.shape[0] != n or keys.shape[0] != n or ids.shape[0] != n or \
                (n and ids.shape[1] != self.n_ids):
            raise ValueError(f"load: {n} records with {self.n_ids} ids each expected")
        buf = np.zeros(self.n_ids + 1, dtype=np.int64)
        cdef id_t[::1] b = buf
        self.evicted = evicted
        with nogil:
            for i in range(n):
                for j in range(self.n_ids):
                    b[j] = ids[i, j]
                self.append(starts[i], ends[i], keys[i], &b[0])

    def py_key_positions(self, int64_t key):
        """Logical positions of the live records with this key, newest first."""
        out = []
        cdef int64_t p = self.newest_with_key(key)
        while p >= 0:
            out.append(p)
            p = self.older_with_key(p)
        return out

    def py_set_evicted(self, int64_t n):
        """Start logical positions at n (restoring a snapshot into an empty queue)."""
        if self.records.size:
            raise ValueError("py_set_evicted needs an empty queue")
        self.evicted = n

    def py_evict_end_before(self, ts_t cutoff):
        return self.evict_end_before(cutoff)

    def py_record(self, int64_t pos):
        if pos < self.evicted or pos >= self.tail_pos():
            raise IndexError(f"position {pos} is not live ({self.evicted}..{self.tail_pos() - 1})")
        cdef int64_t* r = self.at(pos)
        return (r[COL_START], r[COL_END], r[COL_KEY],
                tuple(r[COL_IDS + j] for j in range(self.n_ids)))

    @property
    def nbytes(self):
        return self.records.nbytes + (self.index.mask + 1) * sizeof(Int64Slot)

    @property
    def high_water(self):
        return self.records.high_water


cdef idx_t first_end_after(RingBuffer ring, ts_t t, bint inclusive) noexcept nogil:
    """Index (from the head) of the first record with end > t (>= t if inclusive).

    The ring must be sorted by end ts; binary search.
    """
    cdef idx_t lo = 0, hi = ring.size, mid
    cdef int64_t e
    while lo < hi:
        mid = (lo + hi) // 2
        e = ring.row(mid)[COL_END]
        if e > t or (inclusive and e == t):
            hi = mid
        else:
            lo = mid + 1
    return lo
