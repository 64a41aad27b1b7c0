"""The last ``capacity`` distinct event ids seen, to drop events delivered twice.

An MQTT message whose PUBACK was lost in a crash is delivered (and journaled)
again; its events carry ids already processed. ``admit(ids)`` says, for a batch
in arrival order, which ids are new, and remembers them; once ``capacity`` ids
are held the oldest is forgotten. A FIFO of ids plus an open-addressing hash set
(linear probing, backward-shift deletion), so a batch costs O(n) with no Python
objects.
"""
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free, malloc

import numpy as np

from dqcep._kernels._hash cimport mix64
from dqcep._kernels._types cimport idx_t, id_t


cdef class RecentIds:
    """RecentIds(capacity)"""

    def __cinit__(self, idx_t capacity):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        cdef idx_t table = 2
        while table < 2 * capacity:
            table <<= 1
        self.capacity, self.head, self.size, self.mask = capacity, 0, 0, table - 1
        self.fifo = <id_t*>malloc(capacity * sizeof(id_t))
        self.keys = <id_t*>malloc(table * sizeof(id_t))
        self.used = <uint8_t*>calloc(table, 1)
        if self.fifo == NULL or self.keys == NULL or self.used == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.fifo)
        free(self.keys)
        free(self.used)

    cdef bint contains(self, id_t x) noexcept nogil:
        cdef idx_t i = <idx_t>(mix64(<uint64_t>x) & <uint64_t>self.mask)
        while self.used[i]:
            if self.keys[i] == x:
                return True
            i = (i + 1) & self.mask
        return False

    cdef void insert(self, id_t x) noexcept nogil:
        cdef idx_t i = <idx_t>(mix64(<uint64_t>x) & <uint64_t>self.mask)
        while self.used[i]:
            i = (i + 1) & self.mask
        self.keys[i] = x
        self.used[i] = 1

    cdef void remove(self, id_t x) noexcept nogil:
        cdef idx_t i = <idx_t>(mix64(<uint64_t>x) & <uint64_t>self.mask), j, home
        while self.keys[i] != x:
            i = (i + 1) & self.mask
        j = i
        while True:  # shift back the entries of the probe run that may move into the hole
            j = (j + 1) & self.mask
            if not self.used[j]:
                break
            home = <idx_t>(mix64(<uint64_t>self.keys[j]) & <uint64_t>self.mask)
            if ((j - home) & self.mask) >= ((j - i) & self.mask):
                self.keys[i] = self.keys[j]
                i = j
        self.used[i] = 0

    cdef bint admit_one(self, id_t x) noexcept nogil:
        if self.contains(x):
            return False
        if self.size == self.capacity:
            self.remove(self.fifo[self.head])
            self.head = (self.head + 1) % self.capacity
            self.size -= 1
        self.fifo[(self.head + self.size) % self.capacity] = x
        self.size += 1
        self.insert(x)
        return True

    def admit(self, const int64_t[::1] ids):
        """Boolean mask: True for each id not seen before (now remembered)."""
        out = np.empty(ids.shape[0], dtype=bool)
        cdef uint8_t[::1] fresh = out.view(np.uint8)
        cdef idx_t k
        with nogil:
            for k in range(ids.shape[0]):
                fresh[k] = self.admit_one(ids[k])
        return out

    def ids(self):
        """The remembered ids, oldest first (for a checkpoint; ``admit`` them to restore)."""
        out = np.empty(self.size, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef idx_t k
        for k in range(self.size):
            o[k] = self.fifo[(self.head + k) % self.capacity]
        return out

    def __contains__(self, id_t x):
        return self.contains(x)

    def __len__(self):
        return self.size
