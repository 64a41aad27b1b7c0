# The kernels' one mixer for their hash tables (as pandas' khash gives its tables one
# hash per key type): splitmix64's finaliser over a 64-bit key, so consecutive ids and
# keys spread over a power-of-two table. Tables are rebuilt from their keys on load, so
# this never reaches a snapshot. (cell_hash in store.pyx is not a table hash: it makes the
# partition keys that queues store and snapshots keep.)
from libc.stdint cimport uint64_t


cdef inline uint64_t mix64(uint64_t x) noexcept nogil:
    x += <uint64_t>0x9e3779b97f4a7c15
    x = (x ^ (x >> 30)) * <uint64_t>0xbf58476d1ce4e5b9
    x = (x ^ (x >> 27)) * <uint64_t>0x94d049bb133111eb
    return x ^ (x >> 31)
