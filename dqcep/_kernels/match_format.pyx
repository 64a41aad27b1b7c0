"""Matches -> JSON lines, from the engine's match columns, in one nogil pass.

The per-query constant parts (the query name, each variable's key) arrive as
JSON-encoded bytes made by ``json.dumps``; the kernel only copies them and
writes integers in decimal, so a line is byte for byte what
``json.dumps(match.to_json_obj(), ensure_ascii=False)`` writes (the tests
compare the two).
"""
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from dqcep._kernels._types cimport idx_t

import numpy as np


cdef inline idx_t put_decimal(uint8_t* out, int64_t v) noexcept nogil:
    cdef uint8_t digits[20]
    cdef idx_t n = 0, k = 0
    cdef uint64_t u = <uint64_t>v
    if v < 0:
        out[0] = 45  # '-'
        k = 1
        u = (~u) + 1  # magnitude, exact for INT64_MIN too
    while True:
        digits[n] = 48 + <uint8_t>(u % 10)
        n += 1
        u //= 10
        if u == 0:
            break
    while n:
        n -= 1
        out[k] = digits[n]
        k += 1
    return k


def format_matches(bytes head, list keys, const int64_t[::1] detected,
                   const int64_t[:, ::1] ids, list_of=None, offsets=None,
                   values=None, bytes mid=b', "events": {', bytes tail=b'}}\n',
                   bint with_detected=True) -> bytes:
    """One line per row: head + detected + mid + bound keys/ids + tail (by default
    the spec's JSON line; other ``mid``/``tail`` give other framings of the same
    events object, e.g. a COPY row, and ``with_detected=False`` leaves the time out).

    ``head`` is ``{"query": <name>, "detected_at": ``; ``keys[j]`` is
    ``<variable j>: `` (both JSON); ids below 0 (unbound variables) are left out.
    Kleene lists (``dqcep.runtime.MatchLists``): ``list_of[j]`` is the list column of
    variable j (-1: not a list), whose ids for row i are
    ``values[offsets[i * c + list_of[j]]:offsets[i * c + list_of[j] + 1]]`` (c list
    columns), written as a JSON array.
    """
    cdef idx_t n = detected.shape[0], k = ids.shape[1], i, j, pos = 0, e, c = 0
    cdef const int64_t[::1] lof, off, val
    if len(keys) != k or ids.shape[0] != n:
        raise ValueError("keys and ids columns disagree")
    if not all(isinstance(x, bytes) for x in keys):
        raise TypeError("keys must be bytes")
    if list_of is None:
        lof = np.full(k, -1, dtype=np.int64)
        off = np.zeros(1, dtype=np.int64)
        val = np.zeros(0, dtype=np.int64)
    else:
        lof = np.ascontiguousarray(list_of, dtype=np.int64)
        off = np.ascontiguousarray(offsets, dtype=np.int64)
        val = np.ascontiguousarray(values, dtype=np.int64)
        c = int(np.asarray(lof).max()) + 1 if k else 0
        if lof.shape[0] != k or off.shape[0] != n * c + 1 or \
                (n * c and not 0 <= off[0] <= off[n * c] <= val.shape[0]):
            raise ValueError("list_of, offsets and values disagree with the ids")
        for i in range(n * c):
            if off[i] > off[i + 1]:
                raise ValueError("offsets must not decrease")
    cdef idx_t key_total = sum(len(x) for x in keys)
    cdef idx_t per_row = len(head) + 20 + len(mid) + key_total + k * 24 + len(tail)
    cdef idx_t listed = val.shape[0] * 22
    cdef const uint8_t* h = head
    cdef const uint8_t* m = mid
    cdef const uint8_t* t = tail
    cdef idx_t hn = len(head), mn = len(mid), tn = len(tail)
    cdef const uint8_t** kp = <const uint8_t**>malloc(max(k, 1) * sizeof(uint8_t*))
    cdef idx_t* kn = <idx_t*>malloc(max(k, 1) * sizeof(idx_t))
    cdef uint8_t* out = <uint8_t*>malloc(max(n * per_row + listed, 1))
    cdef bint first
    if kp == NULL or kn == NULL or out == NULL:
        free(kp)
        free(kn)
        free(out)
        raise MemoryError()
    for j in range(k):
        kp[j] = <const uint8_t*><bytes>keys[j]
        kn[j] = len(keys[j])
    try:
        with nogil:
            for i in range(n):
                memcpy(out + pos, h, hn)
                pos += hn
                if with_detected:
                    pos += put_decimal(out + pos, detected[i])
                memcpy(out + pos, m, mn)
                pos += mn
                first = True
                for j in range(k):
                    if lof[j] < 0 and ids[i, j] < 0:
                        continue
                    if not first:
                        out[pos] = 44  # ','
                        out[pos + 1] = 32
                        pos += 2
                    first = False
                    memcpy(out + pos, kp[j], kn[j])
                    pos += kn[j]
                    if lof[j] < 0:
                        pos += put_decimal(out + pos, ids[i, j])
                        continue
                    out[pos] = 91  # '['
                    pos += 1
                    for e in range(off[i * c + lof[j]], off[i * c + lof[j] + 1]):
                        if e > off[i * c + lof[j]]:
                            out[pos] = 44
                            out[pos + 1] = 32
                            pos += 2
                        pos += put_decimal(out + pos, val[e])
                    out[pos] = 93  # ']'
                    pos += 1
                memcpy(out + pos, t, tn)
                pos += tn
        return (<char*>out)[:pos]
    finally:
        free(kp)
        free(kn)
        free(out)
