"""Matches -> JSON lines, from the engine's match columns, in one nogil pass.

The per-query constant parts (the query name, each variable's key) arrive as
JSON-encoded bytes made by ``json.dumps``; the kernel only copies them and
writes integers in decimal, so a line is byte for byte what
``json.dumps(match.to_json_obj(), ensure_ascii=False)`` writes (the tests
compare the two).

``format_matches`` returns every row as one bytes object; ``MatchLines.write_to``
writes them all to a file descriptor through a caller's buffer in one call without
the GIL, so that a sink writes a large batch through one small
buffer it keeps (no buffer of the batch's size to allocate, fill and copy) and
needs the GIL once a part, not once a buffer (a thread waits up to the interpreter's
switch interval, 5 ms, each time it takes the GIL back from a busy one).
"""
from libc.errno cimport EINTR, errno
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from posix.unistd cimport write

import os

from dqcep._kernels._types cimport idx_t

import numpy as np


cdef const char* DIGIT_PAIRS = (b"00010203040506070809101112131415161718192021222324"
                                b"25262728293031323334353637383940414243444546474849"
                                b"50515253545556575859606162636465666768697071727374"
                                b"75767778798081828384858687888990919293949596979899")
DEF ID_BOUND = 24    # an id's decimal (20 with its sign) and the ", " or brackets around it
DEF ITEM_BOUND = 22  # a list element's decimal and the ", " before it


cdef inline idx_t put_decimal(uint8_t* out, int64_t v) noexcept nogil:
    """v in decimal at out (two digits a division); returns the bytes written."""
    cdef uint8_t digits[20]
    cdef idx_t n = 20, k = 0, r
    cdef uint64_t u = <uint64_t>v
    if v < 0:
        out[0] = 45  # '-'
        k = 1
        u = (~u) + 1  # magnitude, exact for INT64_MIN too
    while u >= 100:
        r = <idx_t>(u % 100) * 2
        u //= 100
        n -= 2
        digits[n] = DIGIT_PAIRS[r]
        digits[n + 1] = DIGIT_PAIRS[r + 1]
    if u >= 10:
        n -= 2
        digits[n] = DIGIT_PAIRS[2 * u]
        digits[n + 1] = DIGIT_PAIRS[2 * u + 1]
    else:
        n -= 1
        digits[n] = 48 + <uint8_t>u
    memcpy(out + k, &digits[n], 20 - n)
    return k + 20 - n


cdef struct Framing:
    const uint8_t* head
    const uint8_t* mid
    const uint8_t* tail
    idx_t hn, mn, tn
    const uint8_t** keys
    idx_t* key_len
    idx_t per_row    # a row's bytes at most, its lists' elements left out
    bint with_detected


cdef class MatchLines:
    """MatchLines(head, keys, detected, ids, list_of=None, offsets=None, values=None,
    mid=b', "events": {', tail=b'}}\n', with_detected=True)

    The lines of a part of a MatchBatch, as ``format_matches`` describes them, checked
    once and written to a file (``write_to``) or whole (``all``)."""
    cdef const int64_t[::1] detected
    cdef const int64_t[:, ::1] ids
    cdef const int64_t[::1] lof, off, val
    cdef readonly idx_t n
    cdef idx_t k, c
    cdef Framing f
    cdef list held  # the bytes the framing points into

    def __cinit__(self):
        self.f.keys = NULL
        self.f.key_len = NULL

    def __dealloc__(self):
        free(self.f.keys)
        free(self.f.key_len)

    def __init__(self, bytes head, list keys, const int64_t[::1] detected,
                 const int64_t[:, ::1] ids, list_of=None, offsets=None, values=None,
                 bytes mid=b', "events": {', bytes tail=b'}}\n', bint with_detected=True):
        cdef idx_t n = detected.shape[0], k = ids.shape[1], i, j
        if len(keys) != k or ids.shape[0] != n:
            raise ValueError("keys and ids columns disagree")
        if not all(isinstance(x, bytes) for x in keys):
            raise TypeError("keys must be bytes")
        self.detected, self.ids, self.n, self.k, self.c = detected, ids, n, k, 0
        if list_of is None:
            self.lof = np.full(k, -1, dtype=np.int64)
            self.off = np.zeros(1, dtype=np.int64)
            self.val = np.zeros(0, dtype=np.int64)
        else:
            self.lof = np.ascontiguousarray(list_of, dtype=np.int64)
            self.off = np.ascontiguousarray(offsets, dtype=np.int64)
            self.val = np.ascontiguousarray(values, dtype=np.int64)
            self.c = int(np.asarray(self.lof).max()) + 1 if k else 0
            if self.lof.shape[0] != k or self.off.shape[0] != n * self.c + 1 or \
                    (n * self.c and not 0 <= self.off[0] <= self.off[n * self.c]
                     <= self.val.shape[0]):
                raise ValueError("list_of, offsets and values disagree with the ids")
            for i in range(n * self.c):
                if self.off[i] > self.off[i + 1]:
                    raise ValueError("offsets must not decrease")
        self.held = [head, mid, tail, *keys]
        self.f.head, self.f.mid, self.f.tail = head, mid, tail
        self.f.hn, self.f.mn, self.f.tn = len(head), len(mid), len(tail)
        self.f.with_detected = with_detected
        self.f.keys = <const uint8_t**>malloc(max(k, 1) * sizeof(uint8_t*))
        self.f.key_len = <idx_t*>malloc(max(k, 1) * sizeof(idx_t))
        if self.f.keys == NULL or self.f.key_len == NULL:
            raise MemoryError()
        for j in range(k):
            self.f.keys[j] = <const uint8_t*><bytes>keys[j]
            self.f.key_len[j] = len(keys[j])
        self.f.per_row = self.f.hn + 20 + self.f.mn + sum(len(x) for x in keys) + \
            k * ID_BOUND + self.f.tn

    cdef inline idx_t row_bound(self, idx_t i) noexcept nogil:
        """Row i's bytes at most."""
        if self.c == 0:
            return self.f.per_row
        return self.f.per_row + (self.off[(i + 1) * self.c] - self.off[i * self.c]) * ITEM_BOUND

    cdef idx_t total_bound(self):
        if self.c == 0:
            return self.n * self.f.per_row
        return self.n * self.f.per_row + (self.off[self.n * self.c] - self.off[0]) * ITEM_BOUND

    cdef idx_t write_rows(self, uint8_t* out, idx_t room, idx_t* row) noexcept nogil:
        """Rows from ``row[0]`` on at ``out`` while each fits in ``room`` bytes (by its
        bound); ``row[0]`` moves past them. Returns the bytes written."""
        cdef idx_t i = row[0], j, e, pos = 0, lc, c = self.c
        cdef bint first
        cdef Framing* f = &self.f
        while i < self.n and pos + self.row_bound(i) <= room:
            memcpy(out + pos, f.head, f.hn)
            pos += f.hn
            if f.with_detected:
                pos += put_decimal(out + pos, self.detected[i])
            memcpy(out + pos, f.mid, f.mn)
            pos += f.mn
            first = True
            for j in range(self.k):
                lc = self.lof[j]
                if lc < 0 and self.ids[i, j] < 0:
                    continue
                if not first:
                    out[pos] = 44  # ','
                    out[pos + 1] = 32
                    pos += 2
                first = False
                memcpy(out + pos, f.keys[j], f.key_len[j])
                pos += f.key_len[j]
                if lc < 0:
                    pos += put_decimal(out + pos, self.ids[i, j])
                    continue
                out[pos] = 91  # '['
                pos += 1
                for e in range(self.off[i * c + lc], self.off[i * c + lc + 1]):
                    if e > self.off[i * c + lc]:
                        out[pos] = 44
                        out[pos + 1] = 32
                        pos += 2
                    pos += put_decimal(out + pos, self.val[e])
                out[pos] = 93  # ']'
                pos += 1
            memcpy(out + pos, f.tail, f.tn)
            pos += f.tn
            i += 1
        row[0] = i
        return pos


    def all(self) -> bytes:
        """Every row's line, in one bytes object."""
        cdef idx_t bound = self.total_bound(), row = 0, pos
        cdef uint8_t* out = <uint8_t*>malloc(max(bound, 1))
        if out == NULL:
            raise MemoryError()
        try:
            with nogil:
                pos = self.write_rows(out, bound, &row)
            return (<char*>out)[:pos]
        finally:
            free(out)

    def write_to(self, int fd, uint8_t[::1] buffer) -> int:
        """Every row's line written to the file descriptor ``fd``, formatted into
        ``buffer`` a buffer at a time (a line longer than it gets a buffer of its
        own), all without the GIL; returns the bytes written. A failed write is an
        OSError with its errno (what went before it is written)."""
        cdef idx_t row = 0, size, done, total = 0, need
        cdef ssize_t w
        cdef int err = 0
        if self.n == 0:
            return 0
        need = self.longest
        if need > buffer.shape[0]:
            buffer = np.empty(need, np.uint8)
        with nogil:
            while row < self.n and err == 0:
                size = self.write_rows(&buffer[0], buffer.shape[0], &row)
                done = 0
                while done < size:
                    w = write(fd, &buffer[0] + done, size - done)
                    if w < 0:
                        if errno == EINTR:
                            continue
                        err = errno
                        break
                    done += w
                total += done
        if err:
            raise OSError(err, os.strerror(err))
        return total

    @property
    def longest(self) -> int:
        """The most bytes a row's line can take."""
        cdef idx_t i, most = self.f.per_row
        if self.c == 0:
            return most
        for i in range(self.n):
            most = max(most, self.row_bound(i))
        return most


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
    return MatchLines(head, keys, detected, ids, list_of, offsets, values, mid, tail,
                      with_detected).all()
