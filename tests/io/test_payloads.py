"""Payload decoding: every payload is events or reasons, never an exception."""
import json

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from dqcep.io.payloads import decode_payload, detect_format
from tests.support.examples import examples

GOOD = {"id": 1, "type": "T", "ts": 5, "v": 1.5}


def test_single_event_and_batch():
    assert [e.id for e in decode_payload(msgpack.packb(GOOD))[0]] == [1]
    events, rejected = decode_payload(msgpack.packb(
        {"events": [GOOD, {"id": 2, "type": "T"}, "garbage", {**GOOD, "id": 3}]}))
    assert [e.id for e in events] == [1, 3]
    assert [(r.index, r.reason) for r in rejected] == [
        (1, "event has no 'ts'"), (2, "an event must be a map/object, got str")]
    assert rejected[0].describe() == "event 1 of the batch: event has no 'ts'"
    assert [e.id for e in decode_payload(json.dumps(GOOD).encode(), "json")[0]] == [1]


def test_bad_payloads_have_reasons():
    cases = {
        b"\xc1 not msgpack": "not valid msgpack",
        b"": "not valid msgpack",
        msgpack.packb({"events": 5}): "'events' of a batch must be a list",
        msgpack.packb([1, 2]): "an event must be a map/object, got list",
        msgpack.packb({"id": 1, "type": "T", "ts": "x"}): "'ts' must be an integer",
        msgpack.packb({**GOOD, "v": {"deep": [1]}}): "attribute 'v' must be a number",
    }
    for payload, reason in cases.items():
        events, rejected = decode_payload(payload, "msgpack")
        assert events == [] and reason in rejected[0].reason, (payload, rejected)
    for payload in (b"\xc1 not msgpack", b""):  # detected: neither format
        assert "neither a JSON object or array nor a msgpack map or array" in \
            decode_payload(payload)[1][0].reason
    deep = b"[" * 100_000 + b"]" * 100_000
    assert "nested too deeply" in decode_payload(deep, "json")[1][0].reason
    deep_mp = b"\x91" * 100_000 + b"\xc0"
    assert decode_payload(deep_mp)[1]
    big = msgpack.packb({"events": [GOOD] * 50_000})
    assert len(decode_payload(big)[0]) == 50_000
    assert decode_payload(msgpack.packb({"events": []})) == ([], [])


VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text() |
                      st.binary(), lambda c: st.lists(c, max_size=3) |
                      st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=8)
FIELDS = st.dictionaries(st.sampled_from(["id", "type", "ts", "v", "events"]), VALUES,
                         max_size=5)


@settings(max_examples=examples(1000), deadline=None)
@given(st.one_of(st.binary(max_size=200), FIELDS.map(msgpack.packb),
                 st.lists(FIELDS, max_size=5).map(lambda b: msgpack.packb({"events": b}))),
       st.sampled_from(["msgpack", "json", None]))
def test_fuzzed_payloads_are_events_or_reasons(payload, fmt):
    events, rejected = decode_payload(payload, fmt)
    if not events and not rejected:  # only an empty batch yields nothing at all
        decoded = json.loads(payload) if (fmt or detect_format(payload)) == "json" else \
            msgpack.unpackb(payload, raw=False)
        assert decoded.get("events") == [] and "type" not in decoded
    assert all(r.reason for r in rejected)
