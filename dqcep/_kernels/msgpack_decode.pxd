# msgpack event payloads -> the engine's input columns, and the byte-string tables it needs.
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint64_t

from dqcep._kernels._table cimport Int64Table
from dqcep._kernels._types cimport idx_t


cdef struct BytesEntry:
    idx_t offset       # of the key's bytes in the arena
    idx_t length
    int64_t next       # the previous entry whose key has the same hash, -1: none
    int32_t value


cdef class BytesTable:
    """A map of byte strings to int32 values: the kernels' hash table from each key's
    hash to its entry (keys copied to an arena; keys sharing a hash are chained)."""
    cdef Int64Table by_hash    # hash of a key -> its newest entry with that hash
    cdef BytesEntry* entries
    cdef readonly idx_t n
    cdef idx_t entries_cap
    cdef uint64_t hash_mask    # all ones; fewer bits only in tests, to force chains
    cdef uint8_t* arena
    cdef idx_t arena_len, arena_cap

    cdef int64_t find(self, const uint8_t* s, idx_t n, uint64_t h) noexcept nogil
    cdef int32_t get(self, const uint8_t* s, idx_t n, uint64_t h) noexcept nogil
    cdef int put(self, const uint8_t* s, idx_t n, uint64_t h, int32_t value) except -1 nogil


cdef uint64_t bytes_hash(const uint8_t* s, idx_t n) noexcept nogil
cdef bint utf8_valid(const uint8_t* s, idx_t n) noexcept nogil
cdef idx_t object_end(const uint8_t* p, idx_t pos, idx_t end) noexcept nogil


cdef class ColumnDecoder:
    cdef BytesTable keys       # "type"/"ts"/"id"/"events" -> KEY_*, attribute -> column
    cdef BytesTable types      # event type -> engine type code
    cdef BytesTable strings    # string value -> engine dictionary code
    cdef object dictionary     # .code(str) -> int: codes for strings not yet seen
    cdef readonly idx_t n_attrs
    cdef readonly idx_t rows   # rows held, taken by take()
    cdef idx_t cap
    cdef int64_t* ts
    cdef int64_t* ids
    cdef int32_t* type_codes
    cdef double* val           # row * n_attrs + column
    cdef int8_t* kind          # row * n_attrs + column
    cdef int64_t* span         # row * 2: byte range of the event map in its payload

    cdef int _reserve(self, idx_t rows) except -1 nogil
    cdef int _parse(self, const uint8_t* p, idx_t end) except -2 nogil
    cdef int _event(self, const uint8_t* p, idx_t* pos, idx_t end) except -2 nogil
    cdef int32_t _string_code(self, const uint8_t* s, idx_t n, uint64_t h) except -2 nogil
