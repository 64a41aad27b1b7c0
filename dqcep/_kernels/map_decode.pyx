"""The map's common rule shapes, compiled: journal records -> the engine's input columns.

A device sends one reading per message: ``sensors/<room>/<kind>`` and ``{"value": 23.1}``
or a bare ``23.1``. ``dqcep.io.mapping.TopicMap`` reads such a record in Python (a
dict, a flatten, an ``Event``); ``MapDecoder.decode`` reads a run of them (a
``RecordBlock``'s spans) in one nogil pass and appends one row per record to a
``ColumnDecoder``'s columns, the rows ``TopicMap`` would have given (the service);
``MapDecoder.encode`` writes each record's event as the msgpack map
``msgpack.packb(event.as_mapping())`` gives (``dqcep spark stream``'s rows). It takes
only what it can read exactly as the map does, and stops at the first record it
cannot, for the caller to read it in Python (one rule: the map's; this kernel only
recognises, quickly, the records whose reading is plain):

- the topic must be registered (``register``: the caller resolves a new topic with the
  map once: its rule's event type and level attributes, or that it is not for the
  kernel: a time or id field, renames, no type from the rule or the topic);
- the payload a JSON object of scalar members (numbers, strings without escapes,
  true, false, null; "ts"/"id"/"type" members are dropped as the map drops them; for
  ``encode`` no member twice and at most MAX_MEMBERS), or, for a rule of format
  ``value`` or none, a bare JSON number, true or false;
- the record has an arrival time (the event's time) and is not refused at ingest.

Anything else (nested objects, arrays, escapes, numbers that are not int64 or not
finite, bytes that are not UTF-8, msgpack, text) goes to Python, which says what is
wrong or reads it. Numbers are read as Python reads them: integers of up to 18 digits
exactly, others by ``strtod`` (correctly rounded, as ``float()``).
"""
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport strtod
from libc.string cimport memcmp, memcpy, memmove

import numpy as np

from dqcep._kernels._types cimport idx_t
from dqcep._kernels.msgpack_decode cimport BytesTable, ColumnDecoder, bytes_hash, utf8_valid
from dqcep._kernels.msgpack_encode cimport put_be, put_float, put_int, put_str_header
from dqcep._kernels.store cimport KIND_BOOL, KIND_MISSING, KIND_NUM, KIND_STR

cdef enum:
    ID_SHIFT = 24          # dqcep.io.mapping.ID_SHIFT: a derived id is offset << 24 | index
    KEY_ABSENT = -1        # ColumnDecoder's key table: an attribute no query reads
    MAX_NUMBER = 64        # characters of a number strtod is given

cdef enum Format:          # a rule's payload format, as the kernel reads it
    FORMAT_DETECT          # none given: a JSON object, else a bare value
    FORMAT_JSON
    FORMAT_VALUE

cdef enum Stop:            # why decode or encode stopped
    STOP_DONE              # every record read
    STOP_TOPIC             # the record's topic is not registered yet
    STOP_PYTHON            # the record is for the Python reader
    STOP_FULL              # encode: the output cannot hold the next event

cdef enum:
    MAX_MEMBERS = 64       # members of a JSON object encode takes (more: Python)

DETECT, JSON, VALUE = FORMAT_DETECT, FORMAT_JSON, FORMAT_VALUE
DONE, NEW_TOPIC, PYTHON, FULL = STOP_DONE, STOP_TOPIC, STOP_PYTHON, STOP_FULL

cdef enum Tag:
    T_NIL
    T_BOOL
    T_NUM
    T_STR


cdef struct Value:
    int tag
    double num
    bint integer    # a JSON integer (T_NUM): ``i`` holds it exactly
    int64_t i
    const uint8_t* s
    idx_t n


cdef inline bint is_space(uint8_t c) noexcept nogil:
    return c == 0x20 or c == 0x09 or c == 0x0a or c == 0x0d


cdef inline idx_t skip_space(const uint8_t* p, idx_t i, idx_t end) noexcept nogil:
    while i < end and is_space(p[i]):
        i += 1
    return i


cdef idx_t read_number(const uint8_t* p, idx_t i, idx_t end, Value* value) noexcept nogil:
    """A JSON number at i (RFC 8259 grammar) -> its end, -1 if none or not kept exact;
    ``value.num`` the double Python's float() gives, ``value.integer`` and ``value.i``
    for an integer (as Python's int)."""
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
    value.integer = integer
    if integer:
        if digits > 18:  # may not fit in 64 bits: Python says
            return -1
        value.i = -v if negative else v
        value.num = <double>value.i
        return i
    if i - start > MAX_NUMBER:
        return -1
    memcpy(text, p + start, i - start)
    text[i - start] = 0
    value.num = strtod(text, NULL)
    if value.num - value.num != 0:  # inf: not finite, Python refuses it
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
    return read_number(p, i, end, v)


# ------------------------------------------------------------------ events as msgpack
cdef inline idx_t put_str(uint8_t* out, const uint8_t* s, idx_t n) noexcept nogil:
    """A msgpack str as msgpack-python writes it."""
    cdef idx_t h = put_str_header(out, n)
    memcpy(out + h, s, n)
    return h + n


cdef inline idx_t put_value(uint8_t* out, Value* v) noexcept nogil:
    if v.tag == T_STR:
        return put_str(out, v.s, v.n)
    if v.tag == T_BOOL:
        out[0] = 0xc3 if v.num else 0xc2
        return 1
    if v.integer:
        return put_int(out, v.i)
    return put_float(out, v.num)


cdef inline bint same(const uint8_t* a, idx_t an, const uint8_t* b, idx_t bn) noexcept nogil:
    return an == bn and memcmp(a, b, an) == 0


cdef inline bint event_field(const uint8_t* s, idx_t n) noexcept nogil:
    """"id", "ts" or "type": the event's own fields, no attributes."""
    return (n == 2 and ((s[0] == 0x69 and s[1] == 0x64) or (s[0] == 0x74 and s[1] == 0x73))) \
        or (n == 4 and memcmp(s, b"type", 4) == 0)


cdef const char* VALUE_KEY = b"value"


def _grown(array, need: int):
    """``array`` with room for ``need`` entries (doubling), its contents kept."""
    if need <= len(array):
        return array
    bigger = np.zeros(max(need, 2 * len(array)), array.dtype)
    bigger[:len(array)] = array
    return bigger


cdef class MapDecoder:
    """MapDecoder(decoder, events_column=-1): compiled topics appending rows to
    ``decoder`` (a ``ColumnDecoder``: its attribute columns, event types and string
    codes; ``events_column``: the column of an attribute ``events``), or writing each
    record's event as a msgpack map (``encode``)."""

    cdef ColumnDecoder decoder
    # the decoder's key table gives "events" a code of its own (a msgpack batch's key);
    # to the map it is an attribute like any other: its column, -1 if no query reads it
    cdef int32_t events_key, events_column
    cdef BytesTable topics       # topic -> its index
    cdef readonly idx_t n_topics, n_levels, n_bytes
    # per topic: event type code, format, 0 if its records are for Python, its level
    # attributes (the first in l_* and how many), its type name (in the arena)
    cdef object type_a, format_a, kernel_a, first_a, count_a, tname_a, tname_len_a
    cdef int32_t[::1] t_type
    cdef int8_t[::1] t_format
    cdef int8_t[::1] t_kernel
    cdef int64_t[::1] t_first
    cdef int64_t[::1] t_count
    cdef int64_t[::1] t_name
    cdef int64_t[::1] t_name_len
    # per level attribute: its column (-1: no query reads it), its name and value in
    # the arena
    cdef object column_a, name_a, name_len_a, start_a, length_a, bytes_a
    cdef int32_t[::1] l_column
    cdef int64_t[::1] l_name
    cdef int64_t[::1] l_name_len
    cdef int64_t[::1] l_start
    cdef int64_t[::1] l_length
    cdef uint8_t[::1] arena

    def __cinit__(self, ColumnDecoder decoder, int32_t events_column=-1):
        self.decoder = decoder
        self.events_key, self.events_column = decoder.keys[b"events"], events_column
        self.topics = BytesTable()
        self.n_topics = self.n_levels = self.n_bytes = 0
        self.type_a, self.format_a = np.zeros(16, np.int32), np.zeros(16, np.int8)
        self.kernel_a = np.zeros(16, np.int8)
        self.first_a, self.count_a = np.zeros(16, np.int64), np.zeros(16, np.int64)
        self.tname_a, self.tname_len_a = np.zeros(16, np.int64), np.zeros(16, np.int64)
        self.column_a = np.zeros(16, np.int32)
        self.name_a, self.name_len_a = np.zeros(16, np.int64), np.zeros(16, np.int64)
        self.start_a, self.length_a = np.zeros(16, np.int64), np.zeros(16, np.int64)
        self.bytes_a = np.zeros(256, np.uint8)
        self._views()

    def _views(self):
        self.t_type, self.t_format, self.t_kernel = self.type_a, self.format_a, self.kernel_a
        self.t_first, self.t_count = self.first_a, self.count_a
        self.t_name, self.t_name_len = self.tname_a, self.tname_len_a
        self.l_column, self.l_name, self.l_name_len = self.column_a, self.name_a, self.name_len_a
        self.l_start, self.l_length, self.arena = self.start_a, self.length_a, self.bytes_a

    def _store(self, text: str):
        """``text``'s UTF-8 in the arena: (start, length)."""
        data = np.frombuffer(text.encode(), np.uint8)
        start = self.n_bytes
        self.bytes_a = _grown(self.bytes_a, start + len(data))
        self.bytes_a[start:start + len(data)] = data
        self.n_bytes += len(data)
        return start, len(data)

    def register(self, bytes topic, type_code, int fmt, levels, type_name=""):
        """A topic's reading: ``type_code`` the engine code of its event type (None: its
        records are for Python) and ``type_name`` the type, ``fmt`` DETECT/JSON/VALUE,
        ``levels`` (attribute column or -1, name, value) from its levels, applied over
        the payload's attributes."""
        cdef idx_t t = self.n_topics, first = self.n_levels, k
        self.type_a, self.format_a = _grown(self.type_a, t + 1), _grown(self.format_a, t + 1)
        self.kernel_a, self.first_a = _grown(self.kernel_a, t + 1), _grown(self.first_a, t + 1)
        self.count_a, self.tname_a = _grown(self.count_a, t + 1), _grown(self.tname_a, t + 1)
        self.tname_len_a = _grown(self.tname_len_a, t + 1)
        for column, name, value in levels:
            k = self.n_levels
            self.column_a, self.name_a = _grown(self.column_a, k + 1), _grown(self.name_a, k + 1)
            self.name_len_a = _grown(self.name_len_a, k + 1)
            self.start_a, self.length_a = _grown(self.start_a, k + 1), _grown(self.length_a, k + 1)
            self.column_a[k] = column
            self.name_a[k], self.name_len_a[k] = self._store(name)
            self.start_a[k], self.length_a[k] = self._store(value)
            self.n_levels += 1
        self.type_a[t] = -1 if type_code is None else type_code
        self.format_a[t], self.kernel_a[t] = fmt, type_code is not None
        self.first_a[t], self.count_a[t] = first, self.n_levels - first
        self.tname_a[t], self.tname_len_a[t] = self._store(type_name)
        self._views()
        self.topics[topic] = t
        self.n_topics += 1

    cdef int64_t _topic(self, const uint8_t* p, const int64_t[:, ::1] spans,
                        idx_t i) noexcept nogil:
        """Record i's topic index; -1: not registered yet; -2: the record is for Python
        (its topic's rule, a payload refused or empty, no arrival time)."""
        cdef int64_t topic = self.topics.get(p + spans[i, 0], spans[i, 1],
                                             bytes_hash(p + spans[i, 0], spans[i, 1]))
        if topic < 0:
            return -1
        if not self.t_kernel[topic] or spans[i, 3] <= 0 or spans[i, 4] < 0:  # (INT64_MIN)
            return -2
        return topic

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
            if col == self.events_key:
                col = self.events_column
            # "type", "ts" and "id" members are no attributes here (the map drops
            # them; the type and time come from the rule and the arrival)
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
                topic = self._topic(p, spans, i)
                if topic < 0:
                    why = STOP_TOPIC if topic == -1 else STOP_PYTHON
                    break
                plen = spans[i, 3]
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
                    level.tag, level.s, level.n = T_STR, &self.arena[self.l_start[k]], \
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

    cdef idx_t _member(self, uint8_t* out, idx_t k, const uint8_t* key, idx_t key_n,
                       Value* v, idx_t first, idx_t count, uint8_t* used) noexcept nogil:
        """One attribute of an event map at ``out + k``: its key and value, or the value
        of the topic's level of that name (which gives way to no payload field)."""
        cdef idx_t j
        cdef Value level
        for j in range(count):
            if same(key, key_n, &self.arena[self.l_name[first + j]], self.l_name_len[first + j]):
                used[j] = 1
                level.tag, level.s = T_STR, &self.arena[self.l_start[first + j]]
                level.n = self.l_length[first + j]
                k += put_str(out + k, key, key_n)
                return k + put_value(out + k, &level)
        k += put_str(out + k, key, key_n)
        return k + put_value(out + k, v)

    cdef idx_t _event(self, const uint8_t* p, idx_t pos, idx_t end, idx_t topic,
                      int64_t event_id, int64_t ts, uint8_t* out) noexcept nogil:
        """The map's one event of a payload as ``msgpack.packb(event.as_mapping())``
        writes it, at ``out``: its bytes, or -1 when the payload is for Python."""
        cdef idx_t i, k = 3, n_entries = 3, j, m = 0
        cdef idx_t first = self.t_first[topic], count = self.t_count[topic]
        cdef const uint8_t* keys[MAX_MEMBERS]
        cdef idx_t key_n[MAX_MEMBERS]
        cdef uint8_t used[MAX_MEMBERS]
        cdef Value key, v
        if count > MAX_MEMBERS:
            return -1
        for j in range(count):
            used[j] = 0
        k += put_str(out + k, <const uint8_t*>b"id", 2)
        k += put_int(out + k, event_id)
        k += put_str(out + k, <const uint8_t*>b"type", 4)
        k += put_str(out + k, &self.arena[self.t_name[topic]], self.t_name_len[topic])
        k += put_str(out + k, <const uint8_t*>b"ts", 2)
        k += put_int(out + k, ts)
        i = skip_space(p, pos, end)
        if i < end and p[i] == 0x7b and self.t_format[topic] != FORMAT_VALUE:
            i = skip_space(p, i + 1, end)
            if i < end and p[i] == 0x7d:
                i = skip_space(p, i + 1, end)
            else:
                while True:
                    if i >= end or p[i] != 0x22 or m == MAX_MEMBERS:
                        return -1
                    i = read_literal(p, i, end, &key)
                    if i < 0:
                        return -1
                    for j in range(m):  # a repeated member: Python (the last one wins)
                        if same(key.s, key.n, keys[j], key_n[j]):
                            return -1
                    keys[m], key_n[m] = key.s, key.n
                    m += 1
                    i = skip_space(p, i, end)
                    if i >= end or p[i] != 0x3a:
                        return -1
                    i = read_literal(p, skip_space(p, i + 1, end), end, &v)
                    if i < 0:
                        return -1
                    if v.tag != T_NIL and not event_field(key.s, key.n):
                        k = self._member(out, k, key.s, key.n, &v, first, count, used)
                        n_entries += 1
                    i = skip_space(p, i, end)
                    if i < end and p[i] == 0x2c:
                        i = skip_space(p, i + 1, end)
                        continue
                    if i < end and p[i] == 0x7d:
                        i = skip_space(p, i + 1, end)
                        break
                    return -1
            if i != end:
                return -1
        elif self.t_format[topic] != FORMAT_JSON:
            i = read_literal(p, i, end, &v)
            if i < 0 or v.tag == T_NIL or v.tag == T_STR or skip_space(p, i, end) != end:
                return -1
            k = self._member(out, k, <const uint8_t*>VALUE_KEY, 5, &v, first, count, used)
            n_entries += 1
        else:
            return -1
        for j in range(count):  # the topic's levels no payload field named
            if not used[j]:
                key.tag, key.s = T_STR, &self.arena[self.l_start[first + j]]
                key.n = self.l_length[first + j]
                k += put_str(out + k, &self.arena[self.l_name[first + j]],
                             self.l_name_len[first + j])
                k += put_value(out + k, &key)
                n_entries += 1
        if n_entries <= 15:
            out[2] = 0x80 | <uint8_t>n_entries
            memmove(out, out + 2, k - 2)
            return k - 2
        out[0] = 0xde
        put_be(out + 1, <uint64_t>n_entries, 2)
        return k

    def encode(self, const uint8_t[::1] data, int64_t first, const int64_t[:, ::1] spans,
               idx_t start, uint8_t[::1] out, idx_t at, int64_t[::1] ends,
               int64_t[::1] ids, int64_t[::1] ts):
        """Records ``start``.. of a block as event maps: the map's one event of record i
        as ``msgpack.packb(event.as_mapping())`` writes it, into ``out`` from byte
        ``at`` on, ending at ``ends[i]``; its id and time in ``ids[i]``, ``ts[i]``.
        Returns (the record it stopped at, why: DONE, NEW_TOPIC, PYTHON or FULL, the
        byte after the last event written)."""
        cdef idx_t i = start, n = spans.shape[0], cap = out.shape[0], need, k, j, plen
        cdef int64_t topic
        cdef int why = STOP_DONE
        cdef const uint8_t* p = &data[0] if data.shape[0] else NULL
        with nogil:
            while i < n:
                topic = self._topic(p, spans, i)
                if topic < 0:
                    why = STOP_TOPIC if topic == -1 else STOP_PYTHON
                    break
                plen = spans[i, 3]
                need = 64 + self.t_name_len[topic] + 2 * plen
                for j in range(self.t_first[topic], self.t_first[topic] + self.t_count[topic]):
                    need += 12 + self.l_name_len[j] + self.l_length[j]
                if at + need > cap:
                    why = STOP_FULL
                    break
                ids[i] = (first + i) << ID_SHIFT
                ts[i] = spans[i, 4] // 1000
                k = self._event(p, spans[i, 2], spans[i, 2] + plen, topic, ids[i], ts[i],
                                &out[at])
                if k < 0:
                    why = STOP_PYTHON
                    break
                at += k
                ends[i] = at
                i += 1
        return i, why, at


def recode(const int32_t[::1] types, const double[:, ::1] val, const int8_t[:, ::1] kind,
           const int32_t[::1] type_map, const int64_t[::1] columns,
           const int64_t[::1] strings):
    """Rows a ``SharedReading`` decoded, in one consumer's codes (``Recoding``): each
    type through ``type_map`` (-1 past its end), the attribute columns ``columns`` of
    ``val`` and ``kind``, each string cell's code through ``strings``. Returns (types,
    val, kind), or None where a string has no code of ours yet (past the end of
    ``strings``, or -1 there): the caller codes the new strings and calls again."""
    cdef idx_t n = types.shape[0], m = columns.shape[0], r, j, c
    cdef int64_t code, n_types = type_map.shape[0], n_strings = strings.shape[0]
    out_types = np.empty(n, np.int32)
    out_val = np.empty((n, m), np.float64)
    out_kind = np.empty((n, m), np.int8)
    cdef int32_t[::1] ot = out_types
    cdef double[:, ::1] ov = out_val
    cdef int8_t[:, ::1] ok = out_kind
    cdef bint missing = False
    for j in range(m):
        if not 0 <= columns[j] < val.shape[1]:
            raise ValueError(f"column {columns[j]} is not one of the {val.shape[1]} decoded")
    with nogil:
        for r in range(n):
            ot[r] = type_map[types[r]] if 0 <= types[r] < n_types else -1
            for j in range(m):
                c = columns[j]
                ok[r, j] = kind[r, c]
                if kind[r, c] == KIND_STR:
                    code = <int64_t>val[r, c]
                    if code < 0 or code >= n_strings or strings[code] < 0:
                        missing = True
                        break
                    ov[r, j] = <double>strings[code]
                else:
                    ov[r, j] = val[r, c]
            if missing:
                break
    return None if missing else (out_types, out_val, out_kind)
