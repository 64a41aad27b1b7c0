"""The journal's records in C: framed from MQTT PUBLISH packets, scanned for consumers.

``PublishFramer.frame``: complete MQTT PUBLISH packets -> journal records and PUBACKs,
one pass per read. The MQTT source (``dqcep.io.mqtt``) reads its socket in large buffers. ``frame`` walks
the complete PUBLISH packets of a buffer and writes, for each message, the journal
record ``[u32 length][u32 crc32][msgpack [offset, topic, payload, arrival_us, mid]]``
byte for byte as ``dqcep.io.journal.Journal.append`` writes it, and for each QoS 1
message its PUBACK, to be sent once the records are durable. It stops at the first
packet that is not a PUBLISH (the caller answers it), at an incomplete one (the caller
reads more), when the output is full, or at a malformed packet (the caller closes the
connection: nothing after it was acknowledged).

As the paho path did: a topic that is no UTF-8 is journaled as ``<topic not UTF-8>``;
a payload over ``max_payload`` bytes is journaled as its size (``Refused``); a message
that comes with the DUP flag and the packet id, topic and payload of one of the last
``window`` journal records is a redelivery (its PUBACK was lost): acknowledged, not
journaled again. The fingerprints (packet id -> offset, topic and payload checksum and
sizes) are arrays indexed by packet id, so the loop does no Python object work.
"""
from libc.stdint cimport INT64_MIN, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

import numpy as np

from dqcep._kernels._types cimport idx_t
from dqcep._kernels.msgpack_decode cimport utf8_valid
from dqcep._kernels.msgpack_encode cimport put_be, put_bin_header, put_int, put_str_header

cdef enum Stop:  # what frame() stopped at
    STOP_MORE       # an incomplete packet starts at pos (detail: its full size once known, else 0)
    STOP_CONTROL    # a packet that is no PUBLISH starts at pos
    STOP_FULL       # the output cannot hold the next record (detail: the bytes it needs)
    STOP_MALFORMED  # the packet at pos is malformed (detail: the reason, MALFORMED_REASONS)

MORE, CONTROL, FULL, MALFORMED = STOP_MORE, STOP_CONTROL, STOP_FULL, STOP_MALFORMED

MALFORMED_REASONS = {
    1: "its remaining length takes more than 4 bytes",
    2: "its topic runs past the end of the packet",
    3: "its QoS is 3",
    4: "it is QoS 1 with packet id 0",
    5: "it is QoS 2, above the subscription's QoS 1",
}

cdef const char* NOT_UTF8_C = b"<topic not UTF-8>"
NOT_UTF8 = NOT_UTF8_C
cdef int PACKET_IDS = 65536

cdef uint32_t CRC[8][256]


cdef void _crc_tables():
    cdef uint32_t c
    cdef int i, j
    for i in range(256):
        c = <uint32_t>i
        for j in range(8):
            c = (c >> 1) ^ (0xEDB88320 if c & 1 else 0)
        CRC[0][i] = c
    for i in range(256):
        for j in range(1, 8):
            CRC[j][i] = (CRC[j - 1][i] >> 8) ^ CRC[0][CRC[j - 1][i] & 0xff]


_crc_tables()


cdef uint32_t crc32_update(uint32_t crc, const uint8_t* p, idx_t n) noexcept nogil:
    """zlib's crc32 (``zlib.crc32(data, crc)``), eight bytes a step (slicing-by-8)."""
    cdef uint32_t one, two
    crc = ~crc
    while n >= 8:
        one = (<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
               | (<uint32_t>p[3] << 24)) ^ crc
        two = <uint32_t>p[4] | (<uint32_t>p[5] << 8) | (<uint32_t>p[6] << 16) \
            | (<uint32_t>p[7] << 24)
        crc = (CRC[7][one & 0xff] ^ CRC[6][(one >> 8) & 0xff] ^ CRC[5][(one >> 16) & 0xff]
               ^ CRC[4][one >> 24] ^ CRC[3][two & 0xff] ^ CRC[2][(two >> 8) & 0xff]
               ^ CRC[1][(two >> 16) & 0xff] ^ CRC[0][two >> 24])
        p += 8
        n -= 8
    while n > 0:
        crc = CRC[0][(crc ^ p[0]) & 0xff] ^ (crc >> 8)
        p += 1
        n -= 1
    return ~crc


def crc32(const uint8_t[::1] data, uint32_t crc=0):
    """``zlib.crc32`` (for the tests: the kernel's checksum is zlib's)."""
    return crc32_update(crc, &data[0] if data.shape[0] else NULL, data.shape[0])


cdef inline void put_le32(uint8_t* out, uint32_t v) noexcept nogil:
    out[0], out[1], out[2], out[3] = v & 0xff, (v >> 8) & 0xff, (v >> 16) & 0xff, v >> 24


# a record's bytes besides topic and payload: header 8, array 1, offset 9, topic header
# 5, payload header 5 (or a refused payload's size: 9), arrival 9, packet id 3
cdef enum:
    RECORD_OVERHEAD = 8 + 1 + 9 + 5 + 9 + 9 + 3


cdef class PublishFramer:
    """PublishFramer(max_payload, window): one connection's PUBLISH framing and the
    redelivery fingerprints of the last ``window`` journal records (kept across
    reconnections: a redelivery comes on the next connection)."""

    cdef readonly int64_t max_payload, window
    cdef int64_t[::1] fp_offset      # packet id -> offset of its last journal record, -1
    cdef uint32_t[::1] fp_crc        # crc32 of topic then payload as journaled
    cdef int32_t[::1] fp_topic_len
    cdef int64_t[::1] fp_size        # payload bytes (-1 - size for a refused payload)

    def __cinit__(self, int64_t max_payload, int64_t window):
        self.max_payload, self.window = max_payload, window
        self.fp_offset = np.full(PACKET_IDS, -1, np.int64)
        self.fp_crc = np.zeros(PACKET_IDS, np.uint32)
        self.fp_topic_len = np.zeros(PACKET_IDS, np.int32)
        self.fp_size = np.zeros(PACKET_IDS, np.int64)

    def remember(self, int mid, int64_t offset, bytes topic, payload, int64_t size):
        """A journal record's fingerprint (one of the previous run's last records):
        ``payload`` its bytes, or None for a refused payload of ``size`` bytes."""
        cdef const uint8_t[::1] t = topic
        cdef const uint8_t[::1] p
        cdef uint32_t crc = crc32_update(0, &t[0] if t.shape[0] else NULL, t.shape[0])
        if payload is None:
            self.fp_size[mid] = -1 - size
        else:
            p = payload
            crc = crc32_update(crc, &p[0] if p.shape[0] else NULL, p.shape[0])
            self.fp_size[mid] = p.shape[0]
        self.fp_offset[mid], self.fp_crc[mid], self.fp_topic_len[mid] = offset, crc, t.shape[0]

    def frame(self, const uint8_t[::1] data, idx_t pos, idx_t end, int64_t offset,
              int64_t arrival_us, uint8_t[::1] records, uint8_t[::1] acks):
        """Frame the PUBLISH packets in ``data[pos:end]``; the first record gets journal
        offset ``offset``. Returns (pos, status, detail, records, messages, redelivered,
        record bytes, ack bytes): where it stopped and why (MORE, CONTROL, FULL,
        MALFORMED), journal records written to ``records``, messages read (journaled,
        refused or redelivered), redeliveries among them, and the bytes written to
        ``records`` and ``acks``. ``acks`` must hold ``end - pos`` bytes (a PUBACK is 4
        bytes, a QoS 1 PUBLISH at least 7)."""
        cdef idx_t n_records = 0, n_messages = 0, n_redelivered = 0, r = 0, a = 0
        cdef idx_t cap = records.shape[0], start, i, rem, body_end, topic_len, payload_len
        cdef idx_t need, body, k
        cdef int status = STOP_MORE, shift, qos, mid
        cdef int64_t detail = 0, size
        cdef uint8_t b, kind
        cdef bint dup, refused, utf8
        cdef const uint8_t* topic
        cdef const uint8_t* payload
        cdef uint32_t fp, crc
        cdef const uint8_t* not_utf8 = <const uint8_t*>NOT_UTF8_C
        cdef idx_t not_utf8_len = len(NOT_UTF8)
        with nogil:
            while True:
                start = pos
                if pos + 2 > end:
                    status, detail = STOP_MORE, 0
                    break
                kind = data[pos]
                if kind >> 4 != 3:
                    status = STOP_CONTROL
                    break
                rem, shift, i = 0, 0, pos + 1
                while True:
                    if i >= end:
                        rem = -1
                        break
                    b = data[i]
                    rem |= <idx_t>(b & 0x7f) << shift
                    i += 1
                    if not b & 0x80:
                        break
                    shift += 7
                    if shift == 28:
                        rem = -2
                        break
                if rem == -2:
                    status, detail = STOP_MALFORMED, 1
                    break
                if rem == -1:
                    status, detail = STOP_MORE, 0
                    break
                body_end = i + rem
                if body_end > end:
                    status, detail = STOP_MORE, body_end - pos
                    break
                qos = (kind >> 1) & 3
                dup = (kind >> 3) & 1
                if qos == 3:
                    status, detail = STOP_MALFORMED, 3
                    break
                if qos == 2:
                    status, detail = STOP_MALFORMED, 5
                    break
                if rem < 2:
                    status, detail = STOP_MALFORMED, 2
                    break
                topic_len = (<idx_t>data[i] << 8) | data[i + 1]
                if i + 2 + topic_len + (2 if qos else 0) > body_end:
                    status, detail = STOP_MALFORMED, 2
                    break
                topic = &data[i + 2]
                i += 2 + topic_len
                mid = -1
                if qos:
                    mid = (<int>data[i] << 8) | data[i + 1]
                    i += 2
                    if mid == 0:
                        status, detail = STOP_MALFORMED, 4
                        break
                payload, payload_len = &data[i], body_end - i
                utf8 = utf8_valid(topic, topic_len)
                if not utf8:
                    topic, topic_len = not_utf8, not_utf8_len
                refused = payload_len > self.max_payload
                need = RECORD_OVERHEAD + topic_len + (0 if refused else payload_len)
                fp = crc32_update(0, topic, topic_len)
                if not refused:
                    fp = crc32_update(fp, payload, payload_len)
                size = -1 - payload_len if refused else payload_len
                if (dup and mid >= 0 and self.fp_offset[mid] >= 0
                        and self.fp_offset[mid] >= offset + n_records - self.window
                        and self.fp_crc[mid] == fp and self.fp_topic_len[mid] == topic_len
                        and self.fp_size[mid] == size):
                    n_redelivered += 1
                else:
                    if r + need > cap:
                        status, detail = STOP_FULL, need
                        break
                    body = r + 8
                    k = body
                    records[k] = 0x95
                    k += 1
                    k += put_int(&records[k], offset + n_records)
                    k += put_str_header(&records[k], topic_len)
                    memcpy(&records[k], topic, topic_len)
                    k += topic_len
                    if refused:
                        k += put_int(&records[k], payload_len)
                    else:
                        k += put_bin_header(&records[k], payload_len)
                        memcpy(&records[k], payload, payload_len)
                        k += payload_len
                    k += put_int(&records[k], arrival_us)
                    if mid >= 0:
                        k += put_int(&records[k], mid)
                        self.fp_offset[mid] = offset + n_records
                        self.fp_crc[mid], self.fp_topic_len[mid] = fp, topic_len
                        self.fp_size[mid] = size
                    else:
                        records[k] = 0xc0
                        k += 1
                    put_le32(&records[r], <uint32_t>(k - body))
                    put_le32(&records[r + 4], crc32_update(0, &records[body], k - body))
                    r = k
                    n_records += 1
                if mid >= 0:
                    acks[a], acks[a + 1] = 0x40, 0x02
                    acks[a + 2], acks[a + 3] = <uint8_t>(mid >> 8), <uint8_t>(mid & 0xff)
                    a += 4
                n_messages += 1
                pos = body_end
        return pos, status, detail, n_records, n_messages, n_redelivered, r, a


# ---------------------------------------------------------------- scanning records
cdef enum:
    MAX_RECORD = 64 * 1024 * 1024  # dqcep.io.journal.MAX_RECORD

cdef enum Scan:  # why scan_records stopped
    SCAN_END        # the data ends (a record may be cut there: still being written)
    SCAN_LIMIT      # max_records records
    SCAN_IRREGULAR  # the record at pos is for the Python reader
    SCAN_STOP_TOPIC # the record at pos has a topic that starts with the stop prefix

END, LIMIT, IRREGULAR, STOP_TOPIC = SCAN_END, SCAN_LIMIT, SCAN_IRREGULAR, SCAN_STOP_TOPIC


cdef inline uint32_t get_le32(const uint8_t* p) noexcept nogil:
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) \
        | (<uint32_t>p[3] << 24)


cdef inline uint64_t get_be(const uint8_t* p, int nbytes) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(nbytes):
        v = (v << 8) | p[i]
    return v


cdef int read_uint(const uint8_t* p, idx_t* pos, idx_t end, int64_t* out) noexcept nogil:
    """A non-negative msgpack integer (as msgpack-python writes it); -1 otherwise."""
    cdef uint8_t b
    cdef idx_t i = pos[0]
    cdef int size
    if i >= end:
        return -1
    b = p[i]
    if b < 0x80:
        out[0] = b
        pos[0] = i + 1
        return 0
    if b == 0xcc:
        size = 1
    elif b == 0xcd:
        size = 2
    elif b == 0xce:
        size = 4
    elif b == 0xcf:
        size = 8
    else:
        return -1
    if i + 1 + size > end:
        return -1
    out[0] = <int64_t>get_be(p + i + 1, size)
    if out[0] < 0:
        return -1
    pos[0] = i + 1 + size
    return 0


cdef int read_len(const uint8_t* p, idx_t* pos, idx_t end, uint8_t fix_mask, uint8_t fix_tag,
                  idx_t fix_max, uint8_t c8, uint8_t c16, uint8_t c32, idx_t* out) noexcept nogil:
    """The length of a msgpack str (fixstr/str8/16/32) or bin (bin8/16/32): -1 otherwise."""
    cdef uint8_t b
    cdef idx_t i = pos[0]
    cdef int size
    if i >= end:
        return -1
    b = p[i]
    if fix_mask and (b & fix_mask) == fix_tag:
        out[0] = b & ~fix_mask
        pos[0] = i + 1
        return 0
    if b == c8:
        size = 1
    elif b == c16:
        size = 2
    elif b == c32:
        size = 4
    else:
        return -1
    if i + 1 + size > end:
        return -1
    out[0] = <idx_t>get_be(p + i + 1, size)
    pos[0] = i + 1 + size
    return 0


def scan_records(const uint8_t[::1] data, idx_t pos, int64_t offset, idx_t max_records,
                 const uint8_t[::1] stop_prefix, int64_t[:, ::1] out):
    """Scan records from byte ``pos``; the first must have journal offset ``offset``,
    each next one the next offset. Per record, a row of ``out`` (which has at least
    ``max_records`` rows of 6): topic start and length, payload start and length (a
    payload refused at ingest: -1 - its size), arrival in µs (INT64_MIN: none), packet
    id (-1: none). Returns (pos after the last record scanned, records, why it stopped:
    END, LIMIT, IRREGULAR or STOP_TOPIC)."""
    cdef idx_t end = data.shape[0], n = 0, body, body_end, q, length, tlen, plen
    cdef idx_t stop_len = stop_prefix.shape[0]
    cdef int64_t value, arrival, mid
    cdef uint32_t size
    cdef int why = SCAN_END
    cdef const uint8_t* p = &data[0] if end else NULL
    cdef const uint8_t* stop = &stop_prefix[0] if stop_len else NULL
    with nogil:
        while True:
            if n >= max_records:
                why = SCAN_LIMIT
                break
            if pos + 8 > end:
                why = SCAN_END
                break
            size = get_le32(p + pos)
            if size == 0 or size > MAX_RECORD:
                why = SCAN_IRREGULAR
                break
            body, body_end = pos + 8, pos + 8 + size
            if body_end > end:
                why = SCAN_END
                break
            if p[body] != 0x95 or crc32_update(0, p + body, size) != get_le32(p + pos + 4):
                why = SCAN_IRREGULAR
                break
            q = body + 1
            if read_uint(p, &q, body_end, &value) < 0 or value != offset + n:
                why = SCAN_IRREGULAR
                break
            if read_len(p, &q, body_end, 0xe0, 0xa0, 31, 0xd9, 0xda, 0xdb, &tlen) < 0 \
                    or q + tlen > body_end or not utf8_valid(p + q, tlen):
                why = SCAN_IRREGULAR
                break
            if stop_len and stop_len <= tlen and memcmp(p + q, stop, stop_len) == 0:
                why = SCAN_STOP_TOPIC
                break
            out[n, 0], out[n, 1] = q, tlen
            q += tlen
            if read_len(p, &q, body_end, 0, 0, 0, 0xc4, 0xc5, 0xc6, &plen) == 0:
                if q + plen > body_end:
                    why = SCAN_IRREGULAR
                    break
                out[n, 2], out[n, 3] = q, plen
                q += plen
            elif read_uint(p, &q, body_end, &value) == 0:
                out[n, 2], out[n, 3] = q, -1 - value
            else:
                why = SCAN_IRREGULAR
                break
            if q < body_end and p[q] == 0xc0:
                arrival = INT64_MIN
                q += 1
            elif read_uint(p, &q, body_end, &arrival) < 0:
                why = SCAN_IRREGULAR
                break
            if q < body_end and p[q] == 0xc0:
                mid = -1
                q += 1
            elif read_uint(p, &q, body_end, &mid) < 0:
                why = SCAN_IRREGULAR
                break
            if q != body_end:
                why = SCAN_IRREGULAR
                break
            out[n, 4], out[n, 5] = arrival, mid
            n += 1
            pos = body_end
    return pos, n, why
