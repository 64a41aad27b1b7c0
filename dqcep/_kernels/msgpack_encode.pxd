# Columnar event batch -> msgpack payloads {"events": [<event map>, ...]}.
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint64_t

from dqcep._kernels._types cimport idx_t

cdef idx_t put_int(uint8_t* out, int64_t v) noexcept nogil
cdef idx_t put_float(uint8_t* out, double v) noexcept nogil
cdef idx_t put_blob(uint8_t* out, const uint8_t[::1] blob, const int64_t[::1] offsets,
                    idx_t k) noexcept nogil


# msgpack's big-endian fields and the str and bin headers msgpack-python writes (fixstr,
# str8/16/32; bin8/16/32): inline here, for every kernel that writes msgpack
cdef inline void put_be(uint8_t* out, uint64_t v, int nbytes) noexcept nogil:
    cdef int i
    for i in range(nbytes):
        out[i] = <uint8_t>(v >> (8 * (nbytes - 1 - i)))


cdef inline idx_t put_str_header(uint8_t* out, idx_t n) noexcept nogil:
    if n < 32:
        out[0] = 0xa0 | <uint8_t>n
        return 1
    if n <= 0xff:
        out[0], out[1] = 0xd9, <uint8_t>n
        return 2
    if n <= 0xffff:
        out[0] = 0xda
        put_be(out + 1, <uint64_t>n, 2)
        return 3
    out[0] = 0xdb
    put_be(out + 1, <uint64_t>n, 4)
    return 5


cdef inline idx_t put_bin_header(uint8_t* out, idx_t n) noexcept nogil:
    if n <= 0xff:
        out[0], out[1] = 0xc4, <uint8_t>n
        return 2
    if n <= 0xffff:
        out[0] = 0xc5
        put_be(out + 1, <uint64_t>n, 2)
        return 3
    out[0] = 0xc6
    put_be(out + 1, <uint64_t>n, 4)
    return 5
