"""Hostile and well-formed msgpack payloads (Hypothesis strategies) and the engine of
one query they are read for: the fast path and the validator must read them alike
(test_ingest_kernels, test_columnar, test_spark)."""
import struct

import msgpack
from hypothesis import strategies as st

from dqcep.core.events import TS_LIMIT
from dqcep.lang import parse
from dqcep.plan import build_plan
from dqcep.runtime import Engine

QUERY = "PATTERN SEQ(A a, B b) WHERE a.p = b.q AND a.s = 'x' AND b.ok = true WITHIN 10"


def engine() -> Engine:
    return Engine(build_plan(parse(QUERY).queries))


# ------------------------------------------------------------------ payloads

KEYS = st.sampled_from(["type", "ts", "id", "events", "p", "q", "s", "ok", "other", "é"])
GOOD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6),
    st.sampled_from(["x", "A", "B", "", "ü"]))
ANY_VALUES = st.one_of(
    GOOD_VALUES, st.floats(), st.binary(max_size=3), st.lists(st.integers(-9, 9), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(-9, 9), max_size=2),
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=2)))


def raw_str(data: bytes) -> bytes:
    """A msgpack str whose bytes may not be UTF-8 (msgpack.packb cannot write that)."""
    return (bytes([0xA0 | len(data)]) if len(data) < 32 else b"\xd9" + bytes([len(data)])) + data


@st.composite
def event_pairs(draw, good: bool):
    """Packed key/value pairs of one event map (repeated and odd keys allowed)."""
    pairs = []
    if good or draw(st.integers(0, 5)) > 0:
        pairs = [("type", draw(st.sampled_from(["A", "B", "C", "Ünknown"]))),
                 ("ts", draw(st.integers(-TS_LIMIT, TS_LIMIT) if good else
                             st.integers(-2**63, 2**63 - 1))),
                 ("id", draw(st.integers(-2**63, 2**63 - 1)))]
        if not good and draw(st.integers(0, 3)) == 0:  # one required field left out
            del pairs[draw(st.integers(0, 2))]
        pairs += draw(st.lists(st.tuples(st.sampled_from(["p", "q", "s", "ok", "other"]),
                                         GOOD_VALUES), max_size=5))
    packed = [msgpack.packb(k) + msgpack.packb(v) for k, v in pairs]
    if not good:  # odd pairs; where a key repeats, the last one counts
        odd_keys = st.one_of(KEYS, KEYS, KEYS, st.integers(0, 3), st.binary(max_size=2))
        packed += [msgpack.packb(k) + msgpack.packb(v) for k, v in draw(st.lists(st.tuples(
            odd_keys, st.one_of(GOOD_VALUES, GOOD_VALUES, ANY_VALUES)), max_size=2))]
        if draw(st.integers(0, 3)) == 0:  # a float32 value
            packed.append(msgpack.packb(draw(KEYS)) + b"\xca"
                          + struct.pack(">f", draw(st.floats(width=32))))
        if draw(st.integers(0, 5)) == 0:  # a string that is not UTF-8
            packed.append(msgpack.packb(draw(KEYS))
                          + raw_str(draw(st.binary(min_size=1, max_size=4))))
    draw(st.randoms()).shuffle(packed)
    return msgpack.Packer().pack_map_header(len(packed)) + b"".join(packed)


@st.composite
def payloads(draw, good: bool = False):
    events = draw(st.lists(event_pairs(good), max_size=5 if good else 3))
    shape = draw(st.sampled_from(["batch", "single"] if good else
                                 ["batch", "batch", "batch", "single", "extra", "trailing", "cut", "bytes"]))
    if shape == "bytes":
        return draw(st.binary(max_size=40))
    if shape == "single" and events:
        body = events[0]
    else:
        body = (b"\x81" + msgpack.packb("events")
                + msgpack.Packer().pack_array_header(len(events)) + b"".join(events))
    if shape == "extra":  # a batch with one more key
        body = b"\x82" + body[1:] + msgpack.packb("type") + msgpack.packb("A")
    if shape == "trailing":
        body += b"\xc0"
    if shape == "cut":
        body = body[:draw(st.integers(0, max(0, len(body) - 1)))]
    return body
