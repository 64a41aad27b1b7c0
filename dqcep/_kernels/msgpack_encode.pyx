"""Encode columnar event batches as msgpack payloads, one nogil pass per chunk.

The output is byte-for-byte what ``msgpack.packb({"events": [dict, ...]})``
produces for the same events (minimal integer and header encodings, float64 for
floats, keys in the order id, type, ts, then attributes in schema order), so
every msgpack reader decodes it, and the tests compare it with msgpack itself.

Strings (keys, type names, dictionary values) arrive pre-encoded, with their
msgpack headers, in one byte blob with offsets: the kernel only copies bytes.
"""
from libc.stdint cimport INT64_MIN, int8_t, int32_t, int64_t, uint8_t, uint64_t
from libc.string cimport memcpy

import numpy as np

from dqcep._kernels._types cimport idx_t

cdef enum:  # attribute kinds, in the order of dqcep.core.batch.KINDS
    K_FLOAT = 0
    K_INT = 1
    K_STR = 2
    K_BOOL = 3

cdef enum:  # malformed markers, as in dqcep.core.batch.Malformed
    M_NO_TYPE = 1
    M_BAD_TS = 2
    M_UNDECODABLE = 3


cdef idx_t put_int(uint8_t* out, int64_t v) noexcept nogil:
    """msgpack's minimal encoding of an integer; returns the bytes written."""
    if v >= 0:
        if v < 0x80:
            out[0] = <uint8_t>v
            return 1
        if v <= 0xff:
            out[0] = 0xcc
            out[1] = <uint8_t>v
            return 2
        if v <= 0xffff:
            out[0] = 0xcd
            put_be(out + 1, <uint64_t>v, 2)
            return 3
        if v <= <int64_t>0xffffffff:
            out[0] = 0xce
            put_be(out + 1, <uint64_t>v, 4)
            return 5
        out[0] = 0xcf
        put_be(out + 1, <uint64_t>v, 8)
        return 9
    if v >= -32:
        out[0] = <uint8_t>(0xe0 | (v & 0x1f))
        return 1
    if v >= -0x80:
        out[0] = 0xd0
        out[1] = <uint8_t>(v & 0xff)
        return 2
    if v >= -0x8000:
        out[0] = 0xd1
        put_be(out + 1, <uint64_t>v, 2)
        return 3
    if v >= -<int64_t>0x80000000:
        out[0] = 0xd2
        put_be(out + 1, <uint64_t>v, 4)
        return 5
    out[0] = 0xd3
    put_be(out + 1, <uint64_t>v, 8)
    return 9


cdef idx_t put_float(uint8_t* out, double v) noexcept nogil:
    cdef uint64_t bits
    memcpy(&bits, &v, 8)
    out[0] = 0xcb
    put_be(out + 1, bits, 8)
    return 9


cdef inline idx_t put_header(uint8_t* out, idx_t n, uint8_t fix, uint8_t c16,
                             uint8_t c32, idx_t fix_limit) noexcept nogil:
    if n < fix_limit:
        out[0] = fix | <uint8_t>n
        return 1
    if n <= 0xffff:
        out[0] = c16
        put_be(out + 1, <uint64_t>n, 2)
        return 3
    out[0] = c32
    put_be(out + 1, <uint64_t>n, 4)
    return 5


cdef idx_t put_blob(uint8_t* out, const uint8_t[::1] blob, const int64_t[::1] offsets,
                    idx_t k) noexcept nogil:
    cdef idx_t start = offsets[k], n = offsets[k + 1] - offsets[k]
    memcpy(out, &blob[start], n)
    return n


def encode_payloads(const int64_t[::1] ids, const int64_t[::1] ts, const int32_t[::1] types,
                    const int8_t[::1] malformed,
                    const int8_t[::1] kinds, const int64_t[::1] column_index,
                    const double[:, ::1] floats, const int64_t[:, ::1] ints,
                    const int32_t[:, ::1] strs, const int8_t[:, ::1] bools,
                    const int64_t[::1] dict_base,
                    const uint8_t[::1] blob, const int64_t[::1] offsets,
                    idx_t n_types, idx_t batch_size, uint8_t[::1] out):
    """Encode events into ``out``; return (bytes written, payload end offsets).

    Blob entries, in order: the keys "events", "id", "type", "ts", "garbage"
    (the undecodable stand-in), "not-a-ts" (the bad ts), then one key per
    attribute, then the type names, then the dictionary values (attribute a's
    value v is entry ``dict_base[a] + v``). ``kinds[a]`` and ``column_index[a]``
    locate attribute a's column in floats/ints/strs/bools. ``out`` must be
    large enough (the caller sizes it from the blob's longest entries).
    """
    cdef idx_t n = ids.shape[0], n_attrs = kinds.shape[0]
    cdef idx_t pos = 0, i, a, fields, end, col
    cdef idx_t attr_key0 = 6, type_name0 = 6 + n_attrs
    cdef uint8_t* o = &out[0]
    cdef int8_t bad
    cdef double f
    n_payloads = (n + batch_size - 1) // batch_size if n else 0
    ends_arr = np.empty(n_payloads, dtype=np.int64)
    cdef int64_t[::1] ends = ends_arr
    cdef idx_t p = 0
    with nogil:
        i = 0
        while i < n:
            end = i + batch_size
            if end > n:
                end = n
            o[pos] = 0x81                        # {"events": [...]}
            pos += 1
            pos += put_blob(o + pos, blob, offsets, 0)
            pos += put_header(o + pos, end - i, 0x90, 0xdc, 0xdd, 16)
            while i < end:
                bad = malformed[i]
                if bad == M_UNDECODABLE:
                    pos += put_blob(o + pos, blob, offsets, 4)
                    i += 1
                    continue
                fields = 3 if bad != M_NO_TYPE else 2
                for a in range(n_attrs):
                    col = column_index[a]
                    if kinds[a] == K_FLOAT:
                        fields += floats[col, i] == floats[col, i]   # not NaN
                    elif kinds[a] == K_INT:
                        fields += ints[col, i] != INT64_MIN
                    elif kinds[a] == K_STR:
                        fields += strs[col, i] >= 0
                    else:
                        fields += bools[col, i] >= 0
                pos += put_header(o + pos, fields, 0x80, 0xde, 0xdf, 16)
                pos += put_blob(o + pos, blob, offsets, 1)
                pos += put_int(o + pos, ids[i])
                if bad != M_NO_TYPE:
                    pos += put_blob(o + pos, blob, offsets, 2)
                    pos += put_blob(o + pos, blob, offsets, type_name0 + types[i])
                pos += put_blob(o + pos, blob, offsets, 3)
                if bad == M_BAD_TS:
                    pos += put_blob(o + pos, blob, offsets, 5)
                else:
                    pos += put_int(o + pos, ts[i])
                for a in range(n_attrs):
                    col = column_index[a]
                    if kinds[a] == K_FLOAT:
                        f = floats[col, i]
                        if f == f:
                            pos += put_blob(o + pos, blob, offsets, attr_key0 + a)
                            pos += put_float(o + pos, f)
                    elif kinds[a] == K_INT:
                        if ints[col, i] != INT64_MIN:
                            pos += put_blob(o + pos, blob, offsets, attr_key0 + a)
                            pos += put_int(o + pos, ints[col, i])
                    elif kinds[a] == K_STR:
                        if strs[col, i] >= 0:
                            pos += put_blob(o + pos, blob, offsets, attr_key0 + a)
                            pos += put_blob(o + pos, blob, offsets,
                                            type_name0 + n_types + dict_base[a] + strs[col, i])
                    elif bools[col, i] >= 0:
                        pos += put_blob(o + pos, blob, offsets, attr_key0 + a)
                        o[pos] = 0xc3 if bools[col, i] else 0xc2
                        pos += 1
                i += 1
            ends[p] = pos
            p += 1
    return pos, ends_arr
