# Columnar event batch -> msgpack payloads {"events": [<event map>, ...]}.
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t

from dqcep._kernels._types cimport idx_t

cdef idx_t put_int(uint8_t* out, int64_t v) noexcept nogil
cdef idx_t put_float(uint8_t* out, double v) noexcept nogil
cdef idx_t put_blob(uint8_t* out, const uint8_t[::1] blob, const int64_t[::1] offsets,
                    idx_t k) noexcept nogil
