"""MQTT 3.1.1 on the wire, for the MQTT source: the packets a subscriber sends, and
``Intake``, which turns the bytes read from the broker into journal records and PUBACKs.

The source owns its socket (no client library): every message costs one pass of the
``journal_records`` kernel over the buffer it came in, no Python object. What a
subscriber sends is four packets: CONNECT, SUBSCRIBE, PINGREQ, DISCONNECT (and the
PUBACKs the kernel writes); what it gets besides PUBLISH is CONNACK, SUBACK and PINGRESP.
"""
from __future__ import annotations

import struct
import time

import numpy as np

from dqcep._kernels.journal_records import (CONTROL, FULL, MALFORMED, MALFORMED_REASONS,
                                           MORE, PublishFramer)

PROTOCOL_LEVEL = 4  # MQTT 3.1.1
CONNECT, CONNACK, PUBLISH, PUBACK = 1, 2, 3, 4
SUBSCRIBE, SUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 12, 13, 14
PINGREQ_PACKET = b"\xc0\x00"
DISCONNECT_PACKET = b"\xe0\x00"
SUBACK_FAILURE = 0x80
CONNACK_REFUSALS = {  # MQTT 3.1.1, 3.2.2.3
    1: "unacceptable protocol version",
    2: "client identifier rejected",
    3: "server unavailable",
    4: "bad user name or password",
    5: "not authorized",
}
READ_BUFFER = 1 << 20  # bytes a read may bring
MAX_PACKET = 268_435_455 + 5  # the largest remaining length MQTT can say, and its header


class ProtocolError(Exception):
    """The broker sent what MQTT does not allow: the connection is closed."""


def remaining_length(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(text: str | bytes) -> bytes:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("!H", len(data)) + data


def packet(kind: int, flags: int, body: bytes) -> bytes:
    return bytes([kind << 4 | flags]) + remaining_length(len(body)) + body


def connect_packet(client_id: str, keepalive: int, username: str | None = None,
                   password: str | None = None, clean_session: bool = False) -> bytes:
    flags = (0x80 if username is not None else 0) | (0x40 if password is not None else 0) \
        | (0x02 if clean_session else 0)
    body = _string("MQTT") + bytes([PROTOCOL_LEVEL, flags]) + struct.pack("!H", keepalive) \
        + _string(client_id)
    if username is not None:
        body += _string(username)
    if password is not None:
        body += _string(password)
    return packet(CONNECT, 0, body)


def subscribe_packet(mid: int, topics: list[str], qos: int = 1) -> bytes:
    return packet(SUBSCRIBE, 2, struct.pack("!H", mid)
                  + b"".join(_string(t) + bytes([qos]) for t in topics))


def publish_packet(topic: str | bytes, payload: bytes, mid: int | None = None,
                   dup: bool = False, retain: bool = False) -> bytes:
    """A PUBLISH as a broker sends it: QoS 1 with packet id ``mid``, QoS 0 without."""
    flags = (8 if dup else 0) | (2 if mid is not None else 0) | (1 if retain else 0)
    return packet(PUBLISH, flags, _string(topic)
                  + (struct.pack("!H", mid) if mid is not None else b"") + payload)


def control_packet(data, pos: int, end: int) -> tuple[int, int, bytes, int] | None:
    """(type, flags, body, end) of the complete packet at ``pos``, else None."""
    length, shift, i = 0, 0, pos + 1
    while True:
        if i >= end:
            return None
        b = data[i]
        length |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            break
        shift += 7
        if shift == 28:
            raise ProtocolError(f"a packet of type {data[pos] >> 4} whose remaining length "
                                f"takes more than 4 bytes")
    if i + length > end:
        return None
    return data[pos] >> 4, data[pos] & 0x0F, bytes(data[i:i + length]), i + length


class Intake:
    """Bytes read from the broker -> journal records (appended, not committed) and the
    PUBACKs to send once they are durable.

    ``buffer`` is where the next read goes (``view()`` is the free part, ``received(n)``
    takes what a read put there); ``take(data)`` does both for bytes from elsewhere (the
    tests, calibration). Each read's messages get one arrival time (``stamp(first
    offset, count, time)``). Control packets are
    handed back for the connection to answer; a malformed packet raises ProtocolError
    after the messages before it were taken. ``lock`` is held while records are
    appended (the journal has other writers: the service's own records)."""

    def __init__(self, journal, stamp, lock, max_payload: int, window: int):
        self.journal, self.stamp, self.lock = journal, stamp, lock
        self.framer = PublishFramer(max_payload, window)
        self.buffer = np.empty(READ_BUFFER, np.uint8)
        self._acks = np.empty(READ_BUFFER, np.uint8)
        self._records = np.empty(2 * READ_BUFFER, np.uint8)
        self.filled = 0
        self.acks: list[bytes] = []  # PUBACKs of what was appended, in order
        self.received = 0       # messages read
        self.redelivered = 0    # of which were redeliveries, journaled already
        self.read_bytes = 0     # bytes read on every connection (a malformed packet's place)

    def remember(self, mid: int, offset: int, topic: str, payload: bytes | None,
                 size: int) -> None:
        """A journal record a redelivery is recognised by (see ``PublishFramer``)."""
        self.framer.remember(mid, offset, topic.encode(), payload, size)

    def reset(self) -> None:
        """A new connection: a packet cut by the old one is gone (the broker sends it
        again), and so are the PUBACKs not sent (the redeliveries are acknowledged)."""
        self.filled = 0
        self.acks = []

    def view(self) -> memoryview:
        if self.filled == len(self.buffer):
            self._grow(2 * len(self.buffer))
        return memoryview(self.buffer)[self.filled:]

    def take(self, data: bytes) -> list[tuple[int, int, bytes]]:
        pos = 0
        controls = []
        while pos < len(data):
            free = self.view()
            n = min(len(free), len(data) - pos)
            free[:n] = data[pos:pos + n]
            pos += n
            controls += self.received_bytes(n, time.time())
        return controls

    def received_bytes(self, n: int, now: float) -> list[tuple[int, int, bytes]]:
        """Take the ``n`` bytes a read put at ``view()``, arrived at ``now``; the control
        packets among them, as (type, flags, body)."""
        self.filled += n
        self.read_bytes += n
        controls: list[tuple[int, int, bytes]] = []
        arrival_us = int(now * 1e6)
        pos, end = 0, self.filled
        try:
            while True:
                with self.lock:
                    offset = self.journal.next_offset
                    pos, status, detail, records, messages, redelivered, r, a = \
                        self.framer.frame(self.buffer, pos, end, offset, arrival_us,
                                          self._records, self._acks)
                    if records:
                        self.journal.append_framed(self._records[:r].tobytes(), records)
                        self.stamp(offset, records, now)
                if a:
                    self.acks.append(self._acks[:a].tobytes())
                self.received += messages
                self.redelivered += redelivered
                if status == MORE:
                    if detail > len(self.buffer):
                        self._compact(pos)
                        pos = 0
                        self._grow(detail)
                    break
                if status == FULL:
                    self._records = np.empty(max(2 * len(self._records), 2 * detail), np.uint8)
                elif status == CONTROL:
                    found = control_packet(self.buffer.data, pos, end)
                    if found is None:
                        break
                    kind, flags, body, pos = found
                    controls.append((kind, flags, body))
                elif status == MALFORMED:
                    at = self.read_bytes - (end - pos)
                    raise ProtocolError(f"a malformed PUBLISH at byte {at:,} of what the "
                                        f"broker sent: {MALFORMED_REASONS[detail]}")
        finally:
            self._compact(pos)
        return controls

    def _compact(self, pos: int) -> None:
        rest = self.filled - pos
        if pos and rest:
            self.buffer[:rest] = self.buffer[pos:self.filled]
        self.filled = rest

    def _grow(self, size: int) -> None:
        size = min(max(size, READ_BUFFER), MAX_PACKET)
        if size <= len(self.buffer):
            return
        bigger = np.empty(size, np.uint8)
        bigger[:self.filled] = self.buffer[:self.filled]
        self.buffer = bigger
        self._acks = np.empty(size, np.uint8)
