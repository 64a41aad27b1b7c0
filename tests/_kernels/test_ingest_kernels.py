"""The ingest kernels through their Python API: ColumnDecoder against the
validator (one set of rules), strict UTF-8, BytesTable and RecentIds."""
from collections import deque

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dqcep._kernels.msgpack_decode import BytesTable, ColumnDecoder, is_utf8
from dqcep._kernels.recent_ids import RecentIds
from dqcep.io.payloads import decode_payload
from dqcep.runtime import Engine
from tests.support.examples import examples
from tests.support.msgpack_payloads import engine, payloads

def slow_columns(e: Engine, payload: bytes):
    events, rejected = decode_payload(payload)
    return rejected, tuple(e.columns(events))


def assert_same(fast, slow):
    for name, a, b in zip(("ts", "id", "type", "val", "kind"), fast, slow):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert np.array_equal(a, b), name


@settings(max_examples=examples(600), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(payloads(good=True), min_size=1, max_size=4))
def test_well_formed_payloads_take_the_fast_path_with_the_validators_result(batch):
    e = engine()
    dec = e.column_decoder()
    slow = [slow_columns(e, p) for p in batch]
    for p in batch:
        assert dec.decode(p) >= 0, p
    assert all(not rejected for rejected, _ in slow)
    assert_same(dec.take(), tuple(np.concatenate([c[i] for _, c in slow]) for i in range(5)))
    assert dec.rows == 0


@settings(max_examples=examples(1500), deadline=None, suppress_health_check=list(HealthCheck))
@given(payloads())
def test_the_fast_path_accepts_only_what_the_validator_accepts(payload):
    e = engine()
    dec = e.column_decoder()
    n = dec.decode(payload)
    rejected, cols = slow_columns(e, payload)
    event("fast path" if n >= 0 else "left to the validator")
    if n < 0:
        assert dec.rows == 0  # nothing of a refused payload stays behind
        return
    assert not rejected and n == len(cols[0])
    assert_same(dec.take(), cols)


def test_refused_payload_leaves_earlier_rows_alone():
    dec = engine().column_decoder()
    good = msgpack.packb({"events": [{"type": "A", "ts": 1, "id": 1, "p": 2}]})
    assert dec.decode(good) == 1
    for bad in (msgpack.packb({"events": [{"type": "A", "ts": 1, "id": 2}, {"ts": 3}]}),
                msgpack.packb({"type": "A", "ts": 1.5, "id": 3}),
                msgpack.packb({"type": "A", "ts": 1, "id": 3, "p": float("nan")}),
                msgpack.packb({"type": "A", "ts": 1, "id": 3, "p": [1]}),
                msgpack.packb({"type": "A", "ts": 2**63, "id": 3}),
                msgpack.packb({"type": "A", "ts": True, "id": 3}),
                msgpack.packb({"type": "", "ts": 1, "id": 3}),
                b"", b"\xc1"):
        assert dec.decode(bad) == -1, bad
    ts, ids, *_ = dec.take()
    assert ids.tolist() == [1] and ts.tolist() == [1]


def test_decoder_strings_share_the_engines_dictionary():
    e = engine()
    dec = e.column_decoder()
    payload = msgpack.packb({"events": [{"type": "A", "ts": i, "id": i, "s": v}
                                        for i, v in enumerate(["x", "y", "x", "ü" * 40])]})
    assert dec.decode(payload) == 4
    _, _, types, val, kind = dec.take()
    col = e.attrs.index("s")
    assert [e.dictionary.values[int(c)] for c in val[:, col]] == ["x", "y", "x", "ü" * 40]
    assert types.tolist() == [e.type_code["A"]] * 4


# ---------------------------------------------------------------- utf-8, table

@given(st.binary(max_size=12))
def test_is_utf8_agrees_with_python(data):
    try:
        data.decode("utf-8")
        ok = True
    except UnicodeDecodeError:
        ok = False
    assert is_utf8(data) == ok


@pytest.mark.parametrize("data,ok", [
    ("\U0010FFFF".encode(), True), (b"\xf4\x90\x80\x80", False),   # above U+10FFFF
    (b"\xed\xa0\x80", False), ("\ud7ff".encode(), True),           # surrogate / just below
    (b"\xc0\xaf", False), (b"\xe0\x80\xaf", False), (b"\xf0\x80\x80\xaf", False),  # overlong
    (b"\xe2\x82", False), (b"\xe2\x82\xac", True)])
def test_is_utf8_edges(data, ok):
    assert is_utf8(data) == ok


@pytest.mark.parametrize("hash_bits", [64, 3, 1])
def test_bytes_table_grows_and_overwrites(hash_bits):
    """With 3 or 1 bits of hash nearly every key shares its hash with others: the chains
    of entries per hash, not the hash, tell keys apart."""
    t = BytesTable(hash_bits)
    keys = [f"key-{i}".encode() * (1 + i % 7) for i in range(5000 if hash_bits == 64 else 400)]
    keys.append(b"")
    for i, k in enumerate(keys):
        t[k] = i
    t[keys[10]] = -7
    t[keys[11]] = -1
    assert len(t) == len(keys) and t[keys[10]] == -7 and t[keys[11]] == -1
    assert all(t[k] == i for i, k in enumerate(keys) if i not in (10, 11))
    with pytest.raises(KeyError):
        t[b"absent"]
    with pytest.raises(KeyError):
        t[keys[5] + b"x"]


# ---------------------------------------------------------------- RecentIds

@settings(max_examples=examples(300), deadline=None)
@given(st.integers(1, 9), st.lists(st.lists(st.integers(-5, 30), max_size=12), max_size=8))
def test_recent_ids_agrees_with_a_deque_and_a_set(capacity, batches):
    r, order, seen = RecentIds(capacity), deque(), set()
    for batch in batches:
        expected = []
        for x in batch:
            fresh = x not in seen
            expected.append(fresh)
            if fresh:
                if len(order) == capacity:
                    seen.discard(order.popleft())
                order.append(x)
                seen.add(x)
        assert r.admit(np.array(batch, dtype=np.int64)).tolist() == expected
        assert r.ids().tolist() == list(order) and len(r) == len(order)
        assert all((x in r) == (x in seen) for x in range(-6, 32))


def test_recent_ids_restores_from_its_ids():
    r = RecentIds(1000)
    r.admit(np.arange(0, 5000, 3, dtype=np.int64))
    again = RecentIds(1000)
    again.admit(r.ids())
    probe = np.arange(4000, 6000, dtype=np.int64)
    assert np.array_equal(r.admit(probe.copy()), again.admit(probe.copy()))
    with pytest.raises(ValueError):
        RecentIds(0)


def test_the_decoder_and_the_validator_share_the_range_of_event_times():
    import msgpack

    from dqcep.core import events
    from dqcep._kernels import msgpack_decode
    from dqcep.io.payloads import decode_payload
    assert msgpack_decode.TS_LIMIT == events.TS_LIMIT
    for ts, ok in ((events.TS_LIMIT, True), (-events.TS_LIMIT, True),
                   (events.TS_LIMIT + 1, False), (-events.TS_LIMIT - 1, False)):
        payload = msgpack.packb({"id": 1, "type": "T", "ts": ts})
        assert (ColumnDecoder([], [], None).decode(payload) >= 0) == ok
        got, rejected = decode_payload(payload)
        assert bool(got) == ok and (ok or "range of event times" in rejected[0].reason)


@pytest.mark.integration
def test_a_failed_growth_is_a_memory_error_and_the_decoder_lives_on():
    """The one checked allocator (_alloc.pxd grow): under an address-space limit a
    decoder that cannot grow raises MemoryError, keeps its blocks, and decodes the
    next payload (plain realloc lost the old block and crashed on the next write)."""
    import subprocess
    import sys
    code = """
import resource, msgpack
from dqcep.lang import parse
from dqcep.plan import build_plan
from dqcep.runtime import Engine
e = Engine(build_plan(parse("PATTERN SEQ(A a, B b) WHERE a.p = b.q WITHIN 10").queries))
dec = e.column_decoder()
small = msgpack.packb({"type": "A", "ts": 1, "id": 1, "p": 1})
events = [{"type": "A", "ts": i, "id": i} for i in range(3_000_000)]
big = msgpack.packb({"events": events})
del events
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + 64 * 2**20, hard))
try:
    dec.decode(big)
    print("decoded")
except MemoryError as err:
    print("MemoryError", err)
print(dec.decode(small), len(dec.take()[0]))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("MemoryError could not allocate"), r.stdout
    assert lines[1] == "1 1"
