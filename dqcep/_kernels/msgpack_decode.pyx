"""Decode msgpack event payloads straight into the engine's input columns.

The fast half of payload validation: ``ColumnDecoder.decode`` parses a payload
(one event map, or ``{"events": [<event map>, ...]}``) in one nogil pass and
appends its events as rows of ts, id, engine type code and (kind, value)
attribute cells — no Python object per event. It accepts only payloads that are
entirely well-formed: every event a map with a non-empty string ``type``,
int64 ``ts`` and ``id``, and scalar attributes (numbers that are finite,
strings that are valid UTF-8, booleans, nil). For anything else — a bad event,
a nested value, bin/ext data, a duplicate batch key, trailing bytes — it
appends nothing and returns -1, and the caller hands the payload to the full
validator (``dqcep.core.events.event_from_mapping``), which says what is wrong. So
there is one set of rules; this kernel only recognises, quickly, payloads that
obey all of them (a hypothesis test checks it against the validator).

Strings are looked up by their bytes in open-addressing tables: attribute
names, event types, and string values (which get their codes from the engine's
dictionary the first time each distinct string is seen).
"""
from libc.math cimport isfinite
from libc.stdint cimport INT64_MAX, int8_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc

from libc.string cimport memcmp, memcpy, memset

import numpy as np

from dqcep._kernels._alloc cimport grow
from dqcep._kernels._table cimport table_free, table_get, table_init, table_set
from dqcep._kernels._types cimport idx_t
from dqcep._kernels.store cimport KIND_BOOL, KIND_MISSING, KIND_NUM, KIND_STR

# Event times lie within +-TS_LIMIT (dqcep.core.events.TS_LIMIT; a test keeps them equal).
TS_LIMIT = (1 << 62) - 1
cdef int64_t _TS_LIMIT = TS_LIMIT


cdef enum:  # values of the key table besides attribute columns (>= 0)
    KEY_ABSENT = -1  # an attribute no query reads: validated, not stored
    KEY_TYPE = -3
    KEY_TS = -4
    KEY_ID = -5
    KEY_EVENTS = -6

cdef enum:  # what read_scalar found
    V_NIL
    V_BOOL
    V_INT     # fits in int64
    V_UINT    # above INT64_MAX
    V_FLOAT
    V_STR

cdef struct Scalar:
    int tag
    int64_t i
    uint64_t u
    double f
    const uint8_t* s
    idx_t n


# ------------------------------------------------------------------ helpers

cdef uint64_t bytes_hash(const uint8_t* s, idx_t n) noexcept nogil:
    """FNV-1a over the bytes (the table mixes it further before taking its low bits)."""
    cdef uint64_t h = 0xcbf29ce484222325
    cdef idx_t i
    for i in range(n):
        h = (h ^ s[i]) * <uint64_t>0x100000001b3
    return h


cdef bint utf8_valid(const uint8_t* s, idx_t n) noexcept nogil:
    """Strict UTF-8 as Python decodes it: no overlong forms, surrogates or > U+10FFFF."""
    cdef idx_t i = 0
    cdef uint8_t c, c1
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if c < 0xC2 or c > 0xF4:
            return False
        if c < 0xE0:
            if i + 1 >= n or (s[i + 1] & 0xC0) != 0x80:
                return False
            i += 2
            continue
        if c < 0xF0:
            if i + 2 >= n:
                return False
            c1 = s[i + 1]
            if (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80:
                return False
            if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 >= 0xA0):
                return False
            i += 3
            continue
        if i + 3 >= n:
            return False
        c1 = s[i + 1]
        if (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80 or (s[i + 3] & 0xC0) != 0x80:
            return False
        if (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 >= 0x90):
            return False
        i += 4
    return True


cdef inline uint64_t be(const uint8_t* p, int nbytes) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(nbytes):
        v = (v << 8) | p[i]
    return v


cdef int read_scalar(const uint8_t* p, idx_t* pos, idx_t end, Scalar* out) noexcept nogil:
    """Read one scalar at pos; -1 for anything else (container, bin, ext) or truncation."""
    cdef idx_t at = pos[0]
    cdef uint8_t c
    cdef idx_t need = 0, width = 0
    cdef uint32_t f32bits
    cdef float f32
    cdef uint64_t u
    if at >= end:
        return -1
    c = p[at]
    at += 1
    if c <= 0x7F:
        out.tag, out.i = V_INT, c
    elif c >= 0xE0:
        out.tag, out.i = V_INT, <int8_t>c
    elif 0xA0 <= c <= 0xBF or 0xD9 <= c <= 0xDB:
        if c <= 0xBF:
            need = c & 0x1F
        else:
            width = 1 << (c - 0xD9)
            if at + width > end:
                return -1
            need = <idx_t>be(p + at, <int>width)
            at += width
        if need > end - at:
            return -1
        out.tag, out.s, out.n = V_STR, p + at, need
        at += need
    elif c == 0xC0:
        out.tag = V_NIL
    elif c == 0xC2 or c == 0xC3:
        out.tag, out.i = V_BOOL, c - 0xC2
    elif c == 0xCA:
        if at + 4 > end:
            return -1
        f32bits = <uint32_t>be(p + at, 4)
        memcpy(&f32, &f32bits, 4)
        out.tag, out.f = V_FLOAT, f32
        at += 4
    elif c == 0xCB:
        if at + 8 > end:
            return -1
        u = be(p + at, 8)
        memcpy(&out.f, &u, 8)
        out.tag = V_FLOAT
        at += 8
    elif 0xCC <= c <= 0xCF:  # uint 8/16/32/64
        width = 1 << (c - 0xCC)
        if at + width > end:
            return -1
        u = be(p + at, <int>width)
        at += width
        if u > <uint64_t>INT64_MAX:
            out.tag, out.u = V_UINT, u
        else:
            out.tag, out.i = V_INT, <int64_t>u
    elif 0xD0 <= c <= 0xD3:  # int 8/16/32/64, sign-extended
        width = 1 << (c - 0xD0)
        if at + width > end:
            return -1
        u = be(p + at, <int>width)
        at += width
        if width < 8 and (u >> (8 * width - 1)) & 1:
            u |= ~((<uint64_t>1 << (8 * width)) - 1)
        out.tag, out.i = V_INT, <int64_t>u
    else:
        return -1
    pos[0] = at
    return 0


cdef int read_header(const uint8_t* p, idx_t* pos, idx_t end, uint8_t fix, uint8_t fix_mask,
                     uint8_t c16, idx_t* count) noexcept nogil:
    """A map (fix 0x80) or array (fix 0x90) header; -1 if it is something else."""
    cdef idx_t at = pos[0]
    cdef uint8_t c
    cdef int width
    if at >= end:
        return -1
    c = p[at]
    if (c & fix_mask) == fix:
        count[0] = c & 0x0F
        pos[0] = at + 1
        return 0
    if c == c16 or c == c16 + 1:
        width = 2 if c == c16 else 4
        if at + 1 + width > end:
            return -1
        count[0] = <idx_t>be(p + at + 1, width)
        pos[0] = at + 1 + width
        return 0
    return -1


cdef idx_t object_end(const uint8_t* p, idx_t pos, idx_t end) noexcept nogil:
    """The end of the msgpack object that starts at ``pos`` (one past its last byte),
    or -1 when it runs past ``end`` or holds the never-used byte 0xc1. Iterative:
    a count of the items still to skip, so nesting costs no stack."""
    cdef idx_t remaining = 1, need
    cdef uint8_t c
    while remaining > 0:
        if pos >= end:
            return -1
        c = p[pos]
        pos += 1
        remaining -= 1
        if c <= 0x7f or c >= 0xe0 or c == 0xc0 or c == 0xc2 or c == 0xc3:
            continue                                   # fixint, nil, false, true
        if c <= 0x8f:
            remaining += 2 * <idx_t>(c & 0x0f)         # fixmap
            continue
        if c <= 0x9f:
            remaining += c & 0x0f                      # fixarray
            continue
        if c <= 0xbf:
            pos += c & 0x1f                            # fixstr
            continue
        if c == 0xc1:
            return -1
        if c == 0xc4 or c == 0xd9 or c == 0xc7:        # bin8, str8, ext8: 1-byte length
            need = 1
        elif c == 0xc5 or c == 0xda or c == 0xc8 or c == 0xdc or c == 0xde:
            need = 2                                   # 16-bit length or count
        elif c == 0xc6 or c == 0xdb or c == 0xc9 or c == 0xdd or c == 0xdf:
            need = 4                                   # 32-bit length or count
        else:
            need = 0
        if need:
            if pos + need > end:
                return -1
            if c == 0xdc or c == 0xdd:                 # array16/32
                remaining += <idx_t>be(p + pos, <int>need)
            elif c == 0xde or c == 0xdf:               # map16/32
                remaining += 2 * <idx_t>be(p + pos, <int>need)
            else:                                      # the data (ext: + its type byte)
                pos += <idx_t>be(p + pos, <int>need) + (1 if c in (0xc7, 0xc8, 0xc9) else 0)
            pos += need
            continue
        if c == 0xca or c == 0xce or c == 0xd2:
            pos += 4
        elif c == 0xcb or c == 0xcf or c == 0xd3:
            pos += 8
        elif c == 0xcc or c == 0xd0:
            pos += 1
        elif c == 0xcd or c == 0xd1:
            pos += 2
        elif c >= 0xd4 and c <= 0xd8:                  # fixext 1, 2, 4, 8, 16 + type byte
            pos += 1 + (1 << (c - 0xd4))
    return pos if pos <= end else -1


def record_end(const uint8_t[::1] data, idx_t pos) -> int:
    """``object_end`` for Python (tests): the end of the msgpack object at pos, or -1."""
    if pos >= data.shape[0]:
        return -1
    return object_end(&data[0], pos, data.shape[0])


# --------------------------------------------------------------- BytesTable

cdef class BytesTable:
    """BytesTable(hash_bits=64): a map of byte strings to int32 values, for nogil lookups.

    ``hash_bits`` below 64 keeps only that many bits of each key's hash, so that tests
    can make many keys share a hash."""

    def __cinit__(self, int hash_bits=64):
        if not 1 <= hash_bits <= 64:
            raise ValueError(f"hash_bits must be in 1..64, got {hash_bits}")
        self.hash_mask = (<uint64_t>0xffffffffffffffff) >> (64 - hash_bits)
        self.n, self.entries_cap = 0, 16
        self.arena_len, self.arena_cap = 0, 256
        self.entries = <BytesEntry*>malloc(self.entries_cap * sizeof(BytesEntry))
        self.arena = <uint8_t*>malloc(self.arena_cap)
        if self.entries == NULL or self.arena == NULL:
            raise MemoryError()
        table_init(&self.by_hash, 32)

    def __dealloc__(self):
        table_free(&self.by_hash)
        free(self.entries)
        free(self.arena)

    cdef int64_t find(self, const uint8_t* s, idx_t n, uint64_t h) noexcept nogil:
        """The entry of a key, or -1 when absent."""
        cdef int64_t e = table_get(&self.by_hash, <int64_t>(h & self.hash_mask))
        cdef BytesEntry* entry
        while e >= 0:
            entry = &self.entries[e]
            if entry.length == n and memcmp(self.arena + entry.offset, s, n) == 0:
                return e
            e = entry.next
        return -1

    cdef int32_t get(self, const uint8_t* s, idx_t n, uint64_t h) noexcept nogil:
        """The value of a key, or -1 when absent."""
        cdef int64_t e = self.find(s, n, h)
        return self.entries[e].value if e >= 0 else -1

    cdef int put(self, const uint8_t* s, idx_t n, uint64_t h, int32_t value) except -1 nogil:
        cdef int64_t e = self.find(s, n, h)
        cdef idx_t cap
        if e >= 0:
            self.entries[e].value = value
            return 0
        if self.n == self.entries_cap:
            self.entries = <BytesEntry*>grow(self.entries, 2 * self.entries_cap * sizeof(BytesEntry))
            self.entries_cap *= 2
        cap = self.arena_cap
        if self.arena_len + n > cap:
            while self.arena_len + n > cap:
                cap *= 2
            self.arena = <uint8_t*>grow(self.arena, cap)
            self.arena_cap = cap
        memcpy(self.arena + self.arena_len, s, n)
        h &= self.hash_mask
        self.entries[self.n] = BytesEntry(self.arena_len, n,
                                          table_get(&self.by_hash, <int64_t>h), value)
        table_set(&self.by_hash, <int64_t>h, self.n)
        self.arena_len += n
        self.n += 1
        return 0

    def __setitem__(self, bytes key, int32_t value):
        cdef const uint8_t* s = key
        self.put(s, len(key), bytes_hash(s, len(key)), value)

    def __getitem__(self, bytes key):
        cdef const uint8_t* s = key
        cdef int64_t e = self.find(s, len(key), bytes_hash(s, len(key)))
        if e < 0:
            raise KeyError(key)
        return self.entries[e].value

    def __len__(self):
        return self.n


def is_utf8(bytes data) -> bool:
    """Whether Python would decode ``data`` as strict UTF-8 (for tests)."""
    return utf8_valid(data, len(data))


# ------------------------------------------------------------- ColumnDecoder

cdef class ColumnDecoder:
    """ColumnDecoder(types, attrs, dictionary)

    ``types``: event type names in engine code order; ``attrs``: the attribute
    columns; ``dictionary``: an object whose ``code(str)`` gives the engine's
    code of a string value. ``decode(payload)`` appends the payload's events and
    returns how many, or -1 (nothing appended) when the payload needs the full
    validator; ``take()`` returns and clears the rows held.
    """

    def __cinit__(self, types, attrs, dictionary):
        self.keys, self.types, self.strings = BytesTable(), BytesTable(), BytesTable()
        self.dictionary = dictionary
        self.n_attrs = len(attrs)
        self.rows = 0
        self.cap = 0
        self.ts = self.ids = NULL
        self.type_codes = NULL
        self.val = NULL
        self.kind = NULL
        self.span = NULL
        for code, name in enumerate(types):
            self.types[name.encode()] = code
        for col, name in enumerate(attrs):
            self.keys[name.encode()] = col
        # event fields win over attribute columns of the same name, as in event_from_mapping
        for name, code in ((b"type", KEY_TYPE), (b"ts", KEY_TS), (b"id", KEY_ID),
                           (b"events", KEY_EVENTS)):
            self.keys[name] = code
        self._reserve(1024)

    def __dealloc__(self):
        free(self.ts)
        free(self.ids)
        free(self.type_codes)
        free(self.val)
        free(self.kind)
        free(self.span)

    cdef int _reserve(self, idx_t rows) except -1 nogil:
        """Room for ``rows`` more rows."""
        cdef idx_t need = self.rows + rows, cap = self.cap if self.cap else 1024
        cdef idx_t width = self.n_attrs if self.n_attrs else 1
        if need <= self.cap:
            return 0
        while cap < need:
            cap *= 2
        # each block is replaced only once it has grown: a failure leaves valid blocks
        self.ts = <int64_t*>grow(self.ts, cap * sizeof(int64_t))
        self.ids = <int64_t*>grow(self.ids, cap * sizeof(int64_t))
        self.type_codes = <int32_t*>grow(self.type_codes, cap * sizeof(int32_t))
        self.val = <double*>grow(self.val, cap * width * sizeof(double))
        self.kind = <int8_t*>grow(self.kind, cap * width * sizeof(int8_t))
        self.span = <int64_t*>grow(self.span, cap * 2 * sizeof(int64_t))
        self.cap = cap
        return 0

    cdef int32_t _string_code(self, const uint8_t* s, idx_t n, uint64_t h) except -2 nogil:
        cdef int32_t code = self.strings.get(s, n, h)
        if code == -1:  # first time this string is seen: once per distinct value
            with gil:
                code = self.dictionary.code((<char*>s)[:n].decode("utf-8"))
            self.strings.put(s, n, h, code)
        return code

    cdef int _event(self, const uint8_t* p, idx_t* pos, idx_t end) except -2 nogil:
        """Append one event map at pos as a row; -1 if it is not a well-formed event."""
        cdef idx_t count, k, row = self.rows, base
        cdef int32_t col
        cdef Scalar key, v
        cdef int have = 0
        cdef idx_t first = pos[0]
        if read_header(p, pos, end, 0x80, 0xF0, 0xDE, &count) < 0:
            return -1
        self._reserve(1)
        base = row * self.n_attrs
        memset(self.kind + base, KIND_MISSING, self.n_attrs)
        memset(self.val + base, 0, self.n_attrs * sizeof(double))
        for k in range(count):
            if read_scalar(p, pos, end, &key) < 0 or key.tag != V_STR \
                    or not utf8_valid(key.s, key.n):
                return -1
            if read_scalar(p, pos, end, &v) < 0:
                return -1
            col = self.keys.get(key.s, key.n, bytes_hash(key.s, key.n))
            if col == KEY_TYPE:
                if v.tag != V_STR or v.n == 0 or not utf8_valid(v.s, v.n):
                    return -1
                self.type_codes[row] = self.types.get(v.s, v.n, bytes_hash(v.s, v.n))
                have |= 1
            elif col == KEY_TS or col == KEY_ID:
                if v.tag != V_INT:
                    return -1
                if col == KEY_TS:
                    if v.i < -_TS_LIMIT or v.i > _TS_LIMIT:
                        return -1
                    self.ts[row] = v.i
                    have |= 2
                else:
                    self.ids[row] = v.i
                    have |= 4
            elif col == KEY_EVENTS:  # an event with an "events" attribute: leave it to Python
                return -1
            elif v.tag == V_NIL:  # null: the attribute is absent (a later key wins)
                if col >= 0:
                    self.kind[base + col] = KIND_MISSING
                    self.val[base + col] = 0.0
            elif v.tag == V_STR:
                if not utf8_valid(v.s, v.n):
                    return -1
                if col >= 0:
                    self.kind[base + col] = KIND_STR
                    self.val[base + col] = self._string_code(v.s, v.n, bytes_hash(v.s, v.n))
            elif v.tag == V_FLOAT and not isfinite(v.f):
                return -1
            elif col >= 0:
                if v.tag == V_BOOL:
                    self.kind[base + col] = KIND_BOOL
                    self.val[base + col] = <double>v.i
                else:
                    self.kind[base + col] = KIND_NUM
                    self.val[base + col] = v.f if v.tag == V_FLOAT else \
                        (<double>v.u if v.tag == V_UINT else <double>v.i)
        if have != 7:
            return -1
        self.span[2 * row] = first
        self.span[2 * row + 1] = pos[0]
        self.rows += 1
        return 0

    cdef int _parse(self, const uint8_t* p, idx_t end) except -2 nogil:
        cdef idx_t pos = 0, count, items, i
        cdef Scalar key
        if read_header(p, &pos, end, 0x80, 0xF0, 0xDE, &count) < 0:
            return -1
        if count == 1 and read_scalar(p, &pos, end, &key) == 0 and key.tag == V_STR \
                and key.n == 6 and memcmp(key.s, b"events", 6) == 0:
            if read_header(p, &pos, end, 0x90, 0xF0, 0xDC, &items) < 0:
                return -1
            self._reserve(min(items, end - pos))  # every event takes a byte at least
            for i in range(items):
                if self._event(p, &pos, end) < 0:
                    return -1
        else:
            pos = 0
            if self._event(p, &pos, end) < 0:
                return -1
        return 0 if pos == end else -1

    def forget_strings(self):
        """Drop the cached string codes: the dictionary has freed some of them."""
        self.strings = BytesTable()

    def decode(self, const uint8_t[::1] payload) -> int:
        cdef idx_t before = self.rows
        cdef int rc
        if payload.shape[0] == 0:
            return -1
        with nogil:
            rc = self._parse(&payload[0], payload.shape[0])
        if rc < 0:
            self.rows = before
            return -1
        return self.rows - before

    def decode_stream(self, const uint8_t[::1] data, idx_t pos, idx_t max_rows):
        """Decode the consecutive records of a msgpack stream (a file) from byte ``pos``,
        each as ``decode`` would, until the data ends, ``max_rows`` rows are held, or
        a record needs the full validator. Returns (next pos, records decoded, True
        when stopped at such a record, which starts at next pos)."""
        cdef idx_t n = data.shape[0], records = 0, before, stop
        cdef int rc = 0
        with nogil:
            while pos < n and self.rows < max_rows:
                stop = object_end(&data[0], pos, n)
                if stop < 0:
                    rc = -1
                    break
                before = self.rows
                rc = self._parse(&data[pos], stop - pos)
                if rc < 0:
                    self.rows = before
                    break
                pos = stop
                records += 1
        return pos, records, rc < 0

    def spans(self):
        """int64[rows, 2]: where each held row's event map lies in its payload (start,
        end byte); read before ``take``."""
        out = np.empty((self.rows, 2), np.int64)
        cdef int64_t[:, ::1] o = out
        if self.rows:
            memcpy(&o[0, 0], self.span, self.rows * 2 * sizeof(int64_t))
        return out

    def take(self):
        """(ts, id, type, val, kind) of the rows held, as numpy arrays; clears them."""
        cdef idx_t n = self.rows, a = self.n_attrs
        ts = np.empty(n, np.int64)
        ids = np.empty(n, np.int64)
        types = np.empty(n, np.int32)
        val = np.empty((n, a), np.float64)
        kind = np.empty((n, a), np.int8)
        cdef int64_t[::1] ts_v = ts, ids_v = ids
        cdef int32_t[::1] ty_v = types
        cdef double[:, ::1] val_v = val
        cdef int8_t[:, ::1] kind_v = kind
        if n:
            memcpy(&ts_v[0], self.ts, n * sizeof(int64_t))
            memcpy(&ids_v[0], self.ids, n * sizeof(int64_t))
            memcpy(&ty_v[0], self.type_codes, n * sizeof(int32_t))
            if a:
                memcpy(&val_v[0, 0], self.val, n * a * sizeof(double))
                memcpy(&kind_v[0, 0], self.kind, n * a * sizeof(int8_t))
        self.rows = 0
        return ts, ids, types, val, kind
