"""The map's common rule shapes, compiled: journal records -> the engine's input columns.

A device sends one reading per message: ``sensors/<room>/<kind>`` and ``{"value": 23.1}``
or a bare ``23.1``. ``dqcep.io.mapping.TopicMap`` reads such a record in Python (a
dict, a flatten, an ``Event``); ``MapDecoder.decode`` reads a run of them (a
``RecordBlock``'s spans) in one nogil pass and appends one row per record to a
``ColumnDecoder``'s columns, the rows ``TopicMap`` would have given. It takes only what
it can read exactly as the map does, and stops at the first record it cannot, for the
caller to read it in Python (one rule: the map's; this kernel only recognises, quickly,
the records whose reading is plain):

- the topic must be registered (``register``: the caller resolves a new topic with the
  map once: its rule's event type and level attributes, or that it is not for the
  kernel: a time or id field, renames, no type from the rule or the topic);
- the payload a JSON object of scalar members (numbers, strings without escapes,
  true, false, null; "ts"/"id"/"type" members are dropped as the map drops them), or,
  for a rule of format ``value`` or none, a bare JSON number, true or false;
- the record has an arrival time (the event's time) and is not refused at ingest.

Anything else (nested objects, arrays, escapes, numbers that are not int64 or not
finite, bytes that are not UTF-8, msgpack, text) goes to Python, which says what is
wrong or reads it. Numbers are read as Python reads them: integers of up to 18 digits
exactly, others by ``strtod`` (correctly rounded, as ``float()``).
"""
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t
from libc.stdlib cimport strtod
from libc.string cimport memcpy

import numpy as np

from dqcep._kernels._types cimport idx_t
from dqcep._kernels.msgpack_decode cimport BytesTable, ColumnDecoder, bytes_hash, utf8_valid
from dqcep._kernels.store cimport KIND_BOOL, KIND_MISSING, KIND_NUM, KIND_STR

cdef enum:
    ID_SHIFT = 24          # dqcep.io.mapping.ID_SHIFT: a derived id is offset << 24 | index
    KEY_ABSENT = -1        # ColumnDecoder's key table: an attribute no query reads
    MAX_NUMBER = 64        # characters of a number strtod is given

cdef enum Format:          # a rule's payload format, as the kernel reads it
    FORMAT_DETECT          # none given: a JSON object, else a bare value
    FORMAT_JSON
    FORMAT_VALUE

cdef enum Stop:            # why decode stopped
    STOP_DONE              # every record read
    STOP_TOPIC             # the record's topic is not registered yet
    STOP_PYTHON            # the record is for the Python reader

DETECT, JSON, VALUE = FORMAT_DETECT, FORMAT_JSON, FORMAT_VALUE
DONE, NEW_TOPIC, PYTHON = STOP_DONE, STOP_TOPIC, STOP_PYTHON

cdef enum Tag:
    T_NIL
    T_BOOL
    T_NUM
    T_STR


cdef struct Value:
    int tag
    double num
    const uint8_t* s
    idx_t n


cdef inline bint is_space(uint8_t c) noexcept nogil:
    return c == 0x20 or c == 0x09 or c == 0x0a or c == 0x0d


cdef inline idx_t skip_space(const uint8_t* p, idx_t i, idx_t end) noexcept nogil:
    while i < end and is_space(p[i]):
        i += 1
    return i


cdef idx_t read_number(const uint8_t* p, idx_t i, idx_t end, double* out) noexcept nogil:
    """A JSON number at i (RFC 8259 grammar) -> its end, -1 if none or not kept exact."""
    cdef idx_t start = i, digits = 0
    cdef bint integer = True, negative = False
    cdef int64_t v = 0
    cdef char text[MAX_NUMBER + 1]
    if i < end and p[i] == 0x2d:  # -
        negative = True
        i += 1
    if i >= end or not (0x30 <= p[i] <= 0x39):
        return -1
    if p[i] == 0x30:
        i += 1
        digits = 1
    else:
        while i < end and 0x30 <= p[i] <= 0x39:
            v = v * 10 + (p[i] - 0x30) if digits < 18 else v
            digits += 1
            i += 1
    if i < end and p[i] == 0x2e:  # .
        integer = False
        i += 1
        if i >= end or not (0x30 <= p[i] <= 0x39):
            return -1
        while i < end and 0x30 <= p[i] <= 0x39:
            i += 1
    if i < end and (p[i] == 0x65 or p[i] == 0x45):  # e E
        integer = False
        i += 1
        if i < end and (p[i] == 0x2b or p[i] == 0x2d):
            i += 1
        if i >= end or not (0x30 <= p[i] <= 0x39):
            return -1
        while i < end and 0x30 <= p[i] <= 0x39:
            i += 1
    if integer:
        if digits > 18:  # may not fit in 64 bits: Python says
            return -1
        out[0] = <double>(-v if negative else v)
        return i
    if i - start > MAX_NUMBER:
        return -1
    memcpy(text, p + start, i - start)
    text[i - start] = 0
    out[0] = strtod(text, NULL)
    if out[0] - out[0] != 0:  # inf: not finite, Python refuses it
        return -1
    return i


cdef idx_t read_literal(const uint8_t* p, idx_t i, idx_t end, Value* v) noexcept nogil:
    """true, false, null, a number or a string without escapes at i -> its end, or -1."""
    cdef idx_t j
    cdef bint wide = False
    if i >= end:
        return -1
    if p[i] == 0x22:  # "
        j = i + 1
        while j < end and p[j] != 0x22:
            if p[j] == 0x5c or p[j] < 0x20:  # an escape, a control character: Python
                return -1
            if p[j] >= 0x80:
                wide = True
            j += 1
        if j >= end or (wide and not utf8_valid(p + i + 1, j - i - 1)):
            return -1
        v.tag, v.s, v.n = T_STR, p + i + 1, j - i - 1
        return j + 1
    if p[i] == 0x74 and i + 4 <= end and p[i + 1] == 0x72 and p[i + 2] == 0x75 \
            and p[i + 3] == 0x65:
        v.tag, v.num = T_BOOL, 1.0
        return i + 4
    if p[i] == 0x66 and i + 5 <= end and p[i + 1] == 0x61 and p[i + 2] == 0x6c \
            and p[i + 3] == 0x73 and p[i + 4] == 0x65:
        v.tag, v.num = T_BOOL, 0.0
        return i + 5
    if p[i] == 0x6e and i + 4 <= end and p[i + 1] == 0x75 and p[i + 2] == 0x6c \
            and p[i + 3] == 0x6c:
        v.tag = T_NIL
        return i + 4
    v.tag = T_NUM
    return read_number(p, i, end, &v.num)


cdef const char* VALUE_KEY = b"value"


def _grown(array, need: int):
    """``array`` with room for ``need`` entries (doubling), its contents kept."""
    if need <= len(array):
        return array
    bigger = np.zeros(max(need, 2 * len(array)), array.dtype)
    bigger[:len(array)] = array
    return bigger


cdef class MapDecoder:
    """MapDecoder(decoder): compiled topics appending rows to ``decoder`` (a
    ``ColumnDecoder``: its attribute columns, event types and string codes)."""

    cdef ColumnDecoder decoder
    cdef BytesTable topics       # topic -> its index
    cdef readonly idx_t n_topics, n_levels, n_level_bytes
    # per topic: event type code, format, 0 if its records are for Python, and its
    # level attributes: the first in l_* and how many
    cdef object type_a, format_a, kernel_a, first_a, count_a
    cdef int32_t[::1] t_type
    cdef int8_t[::1] t_format
    cdef int8_t[::1] t_kernel
    cdef int64_t[::1] t_first
    cdef int64_t[::1] t_count
    # per level attribute: its column, where its value's bytes are in l_bytes
    cdef object column_a, start_a, length_a, bytes_a
    cdef int32_t[::1] l_column
    cdef int64_t[::1] l_start
    cdef int64_t[::1] l_length
    cdef uint8_t[::1] l_bytes

    def __cinit__(self, ColumnDecoder decoder):
        self.decoder = decoder
        self.topics = BytesTable()
        self.n_topics = self.n_levels = self.n_level_bytes = 0
        self.type_a, self.format_a = np.zeros(16, np.int32), np.zeros(16, np.int8)
        self.kernel_a = np.zeros(16, np.int8)
        self.first_a, self.count_a = np.zeros(16, np.int64), np.zeros(16, np.int64)
        self.column_a, self.start_a = np.zeros(16, np.int32), np.zeros(16, np.int64)
        self.length_a, self.bytes_a = np.zeros(16, np.int64), np.zeros(256, np.uint8)
        self._views()

    def _views(self):
        self.t_type, self.t_format, self.t_kernel = self.type_a, self.format_a, self.kernel_a
        self.t_first, self.t_count = self.first_a, self.count_a
        self.l_column, self.l_start = self.column_a, self.start_a
        self.l_length, self.l_bytes = self.length_a, self.bytes_a

    def register(self, bytes topic, type_code, int fmt, levels):
        """A topic's reading: ``type_code`` the engine code of its event type (None: its
        records are for Python), ``fmt`` DETECT/JSON/VALUE, ``levels`` (attribute column,
        value) pairs from its levels, applied over the payload's attributes."""
        cdef idx_t t = self.n_topics, first = self.n_levels
        self.type_a, self.format_a = _grown(self.type_a, t + 1), _grown(self.format_a, t + 1)
        self.kernel_a, self.first_a = _grown(self.kernel_a, t + 1), _grown(self.first_a, t + 1)
        self.count_a = _grown(self.count_a, t + 1)
        for column, value in levels:
            data = np.frombuffer(value.encode(), np.uint8)
            k = self.n_levels
            self.column_a, self.start_a = _grown(self.column_a, k + 1), _grown(self.start_a, k + 1)
            self.length_a = _grown(self.length_a, k + 1)
            self.bytes_a = _grown(self.bytes_a, self.n_level_bytes + len(data))
            self.column_a[k], self.start_a[k] = column, self.n_level_bytes
            self.length_a[k] = len(data)
            self.bytes_a[self.n_level_bytes:self.n_level_bytes + len(data)] = data
            self.n_level_bytes += len(data)
            self.n_levels += 1
        self.type_a[t] = -1 if type_code is None else type_code
        self.format_a[t], self.kernel_a[t] = fmt, type_code is not None
        self.first_a[t], self.count_a[t] = first, self.n_levels - first
        self._views()
        self.topics[topic] = t
        self.n_topics += 1

    cdef int _cell(self, idx_t base, int32_t col, Value* v) except -2 nogil:
        if col < 0:
            return 0
        if v.tag == T_NIL:  # null: the attribute is absent (a later member wins)
            self.decoder.kind[base + col], self.decoder.val[base + col] = KIND_MISSING, 0.0
        elif v.tag == T_STR:
            self.decoder.kind[base + col] = KIND_STR
            self.decoder.val[base + col] = self.decoder._string_code(v.s, v.n, bytes_hash(v.s, v.n))
        else:
            self.decoder.kind[base + col] = KIND_BOOL if v.tag == T_BOOL else KIND_NUM
            self.decoder.val[base + col] = v.num
        return 0

    cdef int _object(self, const uint8_t* p, idx_t i, idx_t end, idx_t base) except -2 nogil:
        """The members of a JSON object at i into row ``base``; -1: for Python."""
        cdef Value key, v
        cdef int32_t col
        i = skip_space(p, i + 1, end)
        if i < end and p[i] == 0x7d:  # }: no members
            return 0 if skip_space(p, i + 1, end) == end else -1
        while True:
            if i >= end or p[i] != 0x22:
                return -1
            i = read_literal(p, i, end, &key)
            if i < 0:
                return -1
            i = skip_space(p, i, end)
            if i >= end or p[i] != 0x3a:  # :
                return -1
            i = read_literal(p, skip_space(p, i + 1, end), end, &v)
            if i < 0:
                return -1
            col = self.decoder.keys.get(key.s, key.n, bytes_hash(key.s, key.n))
            # "type", "ts", "id" and "events" members are no attributes here (the
            # map drops them; the type and time come from the rule and the arrival)
            self._cell(base, col, &v)
            i = skip_space(p, i, end)
            if i < end and p[i] == 0x2c:  # ,
                i = skip_space(p, i + 1, end)
                continue
            if i < end and p[i] == 0x7d:
                return 0 if skip_space(p, i + 1, end) == end else -1
            return -1

    cdef int _value(self, const uint8_t* p, idx_t i, idx_t end, idx_t base) except -2 nogil:
        """A bare number, true or false (the attribute ``value``); -1: for Python."""
        cdef Value v
        cdef int32_t col
        i = read_literal(p, i, end, &v)
        if i < 0 or v.tag == T_NIL or v.tag == T_STR or skip_space(p, i, end) != end:
            return -1
        col = self.decoder.keys.get(<const uint8_t*>VALUE_KEY, 5,
                                    bytes_hash(<const uint8_t*>VALUE_KEY, 5))
        self._cell(base, col, &v)
        return 0

    def decode(self, const uint8_t[::1] data, int64_t first, const int64_t[:, ::1] spans,
               idx_t start, int64_t[::1] rows):
        """Records ``start``.. of a block (``spans`` as ``RecordBlock`` has them, record
        i at journal offset ``first + i``) into rows of the decoder, one per record
        (``rows[i] = 1``). Returns (the record it stopped at, why: DONE, NEW_TOPIC or
        PYTHON)."""
        cdef ColumnDecoder d = self.decoder
        cdef idx_t i = start, n = spans.shape[0], base, k, j, end, pos
        cdef int64_t topic, plen
        cdef int why = STOP_DONE, rc
        cdef const uint8_t* p = &data[0] if data.shape[0] else NULL
        cdef Value level
        with nogil:
            while i < n:
                topic = self.topics.get(p + spans[i, 0], spans[i, 1],
                                        bytes_hash(p + spans[i, 0], spans[i, 1]))
                if topic < 0:
                    why = STOP_TOPIC
                    break
                plen = spans[i, 3]
                if not self.t_kernel[topic] or plen <= 0 or spans[i, 4] < 0:  # (none: INT64_MIN)
                    why = STOP_PYTHON
                    break
                pos, end = spans[i, 2], spans[i, 2] + plen
                d._reserve(1)
                base = d.rows * d.n_attrs
                for k in range(d.n_attrs):
                    d.kind[base + k] = KIND_MISSING
                    d.val[base + k] = 0.0
                j = skip_space(p, pos, end)
                if j < end and p[j] == 0x7b and self.t_format[topic] != FORMAT_VALUE:
                    rc = self._object(p, j, end, base)
                elif self.t_format[topic] != FORMAT_JSON:
                    rc = self._value(p, j, end, base)
                else:
                    rc = -1
                if rc < 0:
                    why = STOP_PYTHON
                    break
                for k in range(self.t_first[topic], self.t_first[topic] + self.t_count[topic]):
                    level.tag, level.s, level.n = T_STR, &self.l_bytes[self.l_start[k]], \
                        self.l_length[k]
                    self._cell(base, self.l_column[k], &level)
                d.ts[d.rows] = spans[i, 4] // 1000
                d.ids[d.rows] = (first + i) << ID_SHIFT
                d.type_codes[d.rows] = self.t_type[topic]
                d.span[2 * d.rows], d.span[2 * d.rows + 1] = 0, plen
                d.rows += 1
                rows[i] = 1
                i += 1
        return i, why
