"""The MQTT source's intake (``dqcep.io.mqtt_wire.Intake`` on the ``journal_records``
kernel) against a Python reference parser, over random PUBLISH byte streams read in
random pieces: the same journal bytes, PUBACKs, control packets and errors."""
from __future__ import annotations

import struct
import threading
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dqcep._kernels.journal_records import NOT_UTF8, crc32
from dqcep.io.journal import Journal, Refused, frame_record, segments
from dqcep.io.mqtt_wire import (PINGRESP, SUBACK, Intake, ProtocolError, control_packet,
                                packet, publish_packet, remaining_length)

NOW = 1_765_000_000.25  # every read's arrival time, so both sides frame the same records


def reference(stream: bytes, max_payload: int, window: int, offset: int = 0):
    """(records, acks, controls, error): what the intake must make of ``stream``,
    written from MQTT 3.1.1 and the journal's record format, one message at a time."""
    records, acks, controls = [], [], []
    fingerprints: dict[int, tuple] = {}  # packet id -> (offset, topic, payload or size)
    pos = 0
    while pos < len(stream):
        length, shift, i = 0, 0, pos + 1
        while i < len(stream) and shift < 28:
            length |= (stream[i] & 0x7F) << shift
            i += 1
            if not stream[i - 1] & 0x80:
                break
            shift += 7
        else:
            if shift == 28:
                return records, acks, controls, "more than 4 bytes"
            break  # incomplete
        if i + length > len(stream):
            break
        kind, body = stream[pos], stream[i:i + length]
        pos = i + length
        if kind >> 4 != 3:
            controls.append((kind >> 4, kind & 15, body))
            continue
        qos, dup = (kind >> 1) & 3, bool(kind & 8)
        if qos == 3:
            return records, acks, controls, "QoS is 3"
        if qos == 2:
            return records, acks, controls, "QoS 2"
        if len(body) < 2 or 2 + struct.unpack("!H", body[:2])[0] + (2 if qos else 0) > len(body):
            return records, acks, controls, "topic runs past"
        n = struct.unpack("!H", body[:2])[0]
        raw_topic, rest = body[2:2 + n], body[2 + n:]
        mid = struct.unpack("!H", rest[:2])[0] if qos else None
        payload = rest[2:] if qos else rest
        if mid == 0:
            return records, acks, controls, "packet id 0"
        try:
            topic = raw_topic.decode("utf-8")
        except UnicodeDecodeError:
            topic = NOT_UTF8.decode()
        kept = Refused(len(payload)) if len(payload) > max_payload else payload
        seen = fingerprints.get(mid)
        if not (dup and seen is not None and seen[0] >= offset - window
                and seen[1:] == (topic, kept)):
            records.append(frame_record(offset, topic, kept, int(NOW * 1e6), mid))
            if mid is not None:
                fingerprints[mid] = (offset, topic, kept)
            offset += 1
        if qos:
            acks.append(b"\x40\x02" + struct.pack("!H", mid))
    return records, acks, controls, None


def feed(intake: Intake, stream: bytes, cuts: list[int]):
    """The stream in pieces as reads bring them; (controls, error text)."""
    controls, at = [], 0
    for end in sorted(set(cuts)) + [len(stream)]:
        while at < end:
            free = intake.view()
            n = min(len(free), end - at)
            free[:n] = stream[at:at + n]
            at += n
            try:
                controls += intake.received_bytes(n, NOW)
            except ProtocolError as err:
                return controls, str(err)
    return controls, None


def journal_bytes(directory) -> bytes:
    return b"".join(p.read_bytes() for p in segments(directory))


TOPICS = st.one_of(
    st.sampled_from(["sensors/r1/T", "x" * 40, "é/" * 150, "sensors/ü/#"]),
    st.text(max_size=6),
    st.sampled_from([b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82", b"a\xf4\x90\x80\x80",
                     b"\xf0\x9f\x98\x80", b"\xe0\xa0\x80"]),
    st.binary(max_size=6),
)
MESSAGES = st.lists(st.tuples(
    TOPICS,
    st.sampled_from([b"", b"1", b'{"value": 21.5}', b"y" * 45, b"z" * 300]),
    st.sampled_from([None, 1, 2, 3, 65535]),  # a packet id (QoS 1) or None (QoS 0)
    st.booleans(),                             # DUP
    st.booleans(),                             # RETAIN
    st.sampled_from([None, None, None, b"\xd0\x00", packet(SUBACK, 0, b"\x00\x01\x01")]),
), max_size=30)
MALFORMED = st.sampled_from([
    None, None,
    b"\x30\xff\xff\xff\xff\x01",          # a remaining length of 5 bytes
    b"\x36\x05\x00\x01a\x00\x01",        # QoS 3
    b"\x34\x05\x00\x01a\x00\x01",        # QoS 2
    b"\x32\x03\x00\x05a",                # a topic longer than the packet
    b"\x32\x05\x00\x01a\x00\x00",        # QoS 1, packet id 0
    b"\x30\x01\x00",                     # no room for the topic length
])


@settings(max_examples=300, deadline=None)
@given(messages=MESSAGES, malformed=MALFORMED, max_payload=st.sampled_from([40, 1 << 20]),
       window=st.sampled_from([2, 4096]), data=st.data())
def test_the_kernel_frames_what_the_reference_parser_reads(tmp_path_factory, messages,
                                                           malformed, max_payload, window,
                                                           data):
    stream = b"".join(publish_packet(t, p, mid, dup, retain) + (control or b"")
                      for t, p, mid, dup, retain, control in messages) + (malformed or b"")
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8), label="cuts")
    directory = tmp_path_factory.mktemp("journal")
    journal = Journal(directory, fsync="never")
    stamped = []
    intake = Intake(journal, lambda first, count, t: stamped.append((first, count, t)),
                    threading.Lock(), max_payload, window)
    controls, error = feed(intake, stream, cuts)
    journal.commit()
    records, acks, want_controls, want_error = reference(stream, max_payload, window)
    assert journal_bytes(directory) == b"".join(records)
    assert b"".join(intake.acks) == b"".join(acks)
    assert (error is None) == (want_error is None)
    if error is None:
        assert controls == want_controls
    else:  # the connection is closed: the control packets of that read do not matter
        assert want_error in error and "malformed PUBLISH at byte" in error
    assert sum(c for _, c, _ in stamped) == len(records) and {t for *_, t in stamped} <= {NOW}
    assert journal.next_offset == len(records)
    assert [r.offset for r in journal.read()] == list(range(len(records)))
    journal.close()


def test_a_packet_larger_than_the_buffer_and_the_output_grows_them(tmp_path):
    """A 3 MiB payload (the read buffer is 1 MiB, the records' output 2 MiB), read in
    64 KiB pieces, is one record."""
    journal = Journal(tmp_path, fsync="never")
    intake = Intake(journal, lambda *a: None, threading.Lock(), 16 << 20, 4096)
    big = bytes(range(256)) * (3 << 12)
    stream = publish_packet("big", big, 9) + publish_packet("small", b"1", 10)
    controls, error = feed(intake, stream, list(range(0, len(stream), 1 << 16)))
    journal.commit()
    assert (controls, error) == ([], None)
    assert [(r.topic, r.payload, r.mid) for r in journal.read()] == [
        ("big", big, 9), ("small", b"1", 10)]
    journal.close()


def test_a_redelivery_is_known_by_the_journals_last_records_after_a_restart(tmp_path):
    """Fingerprints of the previous run's records (``remember``) as those of this run."""
    journal = Journal(tmp_path, fsync="never")
    first = Intake(journal, lambda *a: None, threading.Lock(), 40, 4096)
    feed(first, publish_packet("t", b"a", 5) + publish_packet("t", b"x" * 50, 6), [])
    journal.commit()
    again = Intake(journal, lambda *a: None, threading.Lock(), 40, 4096)
    for r in journal.read():
        payload = r.payload
        again.remember(r.mid, r.offset, r.topic, None if isinstance(payload, Refused)
                       else payload, payload.size if isinstance(payload, Refused)
                       else len(payload))
    feed(again, publish_packet("t", b"a", 5, dup=True) + publish_packet("t", b"x" * 50, 6, True)
         + publish_packet("t", b"x" * 51, 6, True), [])
    assert again.redelivered == 2 and again.received == 3
    assert journal.next_offset == 3


@given(st.binary(max_size=100), st.integers(0, 2**32 - 1))
def test_the_kernels_checksum_is_zlibs(data, start):
    assert crc32(data, start) == zlib.crc32(data, start)


@pytest.mark.parametrize("n", [0, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 268_435_455])
def test_remaining_lengths_take_the_bytes_mqtt_says(n):
    size = 1 if n < 128 else 2 if n < 16_384 else 3 if n < 2_097_152 else 4
    encoded = remaining_length(n)
    assert len(encoded) == size
    if n <= 16_384:
        assert control_packet(b"\xd0" + encoded + b"\1" * n, 0, 1 + size + n) == \
            (PINGRESP, 0, b"\1" * n, 1 + size + n)
        assert control_packet(b"\xd0" + encoded + b"\1" * n, 0, size + n) is None
