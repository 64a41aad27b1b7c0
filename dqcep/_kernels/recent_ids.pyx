"""The last ``capacity`` distinct event ids seen, to drop events delivered twice.

An MQTT message whose PUBACK was lost in a crash is delivered (and journaled)
again; its events carry ids already processed. ``admit(ids)`` says, for a batch
in arrival order, which ids are new, and remembers them; once ``capacity`` ids
are held the oldest is forgotten. A FIFO of ids plus the kernels' hash table
(``_table.pxd``) as a set, so a batch costs O(n) with no Python objects.
"""
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc

import numpy as np

from dqcep._kernels._table cimport table_free, table_get, table_init, table_remove, table_set
from dqcep._kernels._types cimport idx_t, id_t


cdef class RecentIds:
    """RecentIds(capacity)"""

    def __cinit__(self, idx_t capacity):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity, self.head, self.size = capacity, 0, 0
        self.fifo = <id_t*>malloc(capacity * sizeof(id_t))
        if self.fifo == NULL:
            raise MemoryError(f"could not allocate {capacity} ids")
        table_init(&self.held, 2 * capacity)   # never more than half full: it never grows

    def __dealloc__(self):
        free(self.fifo)
        table_free(&self.held)

    cdef bint admit_one(self, id_t x) noexcept nogil:
        if table_get(&self.held, x) >= 0:
            return False
        if self.size == self.capacity:
            table_remove(&self.held, self.fifo[self.head])
            self.head = (self.head + 1) % self.capacity
            self.size -= 1
        self.fifo[(self.head + self.size) % self.capacity] = x
        self.size += 1
        table_set(&self.held, x, 0)
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
        return table_get(&self.held, x) >= 0

    def __len__(self):
        return self.size
