"""The generator's kernels through their Python API: msgpack encoder, reflected walk."""
import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dqcep.generator._walk import reflected_walk
from dqcep.core.batch import MISSING_INT, EventBatch, Malformed, Schema
from dqcep.io.event_writers import BAD_TS, BatchEncoder
from tests.support.examples import examples

SCHEMA = Schema(("A", "Bee", "x" * 40), (("f", "float"), ("n", "int"), ("room", "str"),
                                         ("ok", "bool")),
                (("room", ("r1", "é" * 20, "long" * 80)),))


@st.composite
def batches(draw):
    n = draw(st.integers(0, 60))
    ints = hnp.arrays(np.int64, n, elements=st.one_of(
        st.integers(-2**63, 2**63 - 1), st.integers(-300, 300),
        st.sampled_from([127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, -32, -33,
                         -128, -129, -32768, -32769, -2**31, -2**31 - 1])))
    floats = hnp.arrays(np.float64, n, elements=st.floats(allow_nan=True, allow_infinity=False))
    return EventBatch(
        SCHEMA, draw(ints), draw(ints), draw(hnp.arrays(np.int32, n, elements=st.integers(0, 2))),
        {"f": draw(floats),
         "n": draw(ints),
         "room": draw(hnp.arrays(np.int32, n, elements=st.integers(-1, 2))),
         "ok": draw(hnp.arrays(np.int8, n, elements=st.integers(-1, 1)))},
        draw(hnp.arrays(np.int8, n, elements=st.integers(0, 3))))


def reference_payloads(batch, size):
    events = []
    for i in range(len(batch)):
        bad = 0 if batch.malformed is None else int(batch.malformed[i])
        if bad == Malformed.UNDECODABLE:
            events.append("garbage")
            continue
        obj = {"id": int(batch.id[i])}
        if bad != Malformed.NO_TYPE:
            obj["type"] = SCHEMA.types[batch.type[i]]
        obj["ts"] = BAD_TS if bad == Malformed.BAD_TS else int(batch.ts[i])
        for name, _ in SCHEMA.attrs:
            v = batch.value(name, i)
            if v is not None:
                obj[name] = v
        events.append(obj)
    return [msgpack.packb({"events": events[i:i + size]}) for i in range(0, len(events), size)]


@settings(max_examples=examples(300), deadline=None)
@given(batches(), st.sampled_from([1, 7, 15, 16, 17, 1000]))
def test_msgpack_kernel_writes_exactly_what_msgpack_writes(batch, size):
    buf, ends = BatchEncoder(SCHEMA, "msgpack", size).msgpack_payloads(batch)
    want = reference_payloads(batch, size)
    assert buf.tobytes() == b"".join(want)
    assert list(ends) == list(np.cumsum([len(w) for w in want]))


def test_large_payload_headers():
    n = 70_000  # array32 header, map16 headers for wide events
    b = EventBatch(SCHEMA, np.arange(n, dtype=np.int64), np.zeros(n, np.int64),
                   np.zeros(n, np.int32))
    buf, ends = BatchEncoder(SCHEMA, "msgpack", n).msgpack_payloads(b)
    assert buf.tobytes() == reference_payloads(b, n)[0]


def test_reflected_walk_matches_a_python_model():
    rng = np.random.default_rng(5)
    n, k = 5000, 4
    source = rng.integers(0, k, n).astype(np.int32)
    steps = rng.normal(0, 3, n)
    lo, hi = np.array([0.0, -5, 10, 0]), np.array([10.0, 5, 11, 0.5])
    state = np.array([5.0, 0, 10.5, 0.25])
    model = state.copy()
    out = reflected_walk(source, steps, state, lo, hi)
    for i in range(n):
        s = source[i]
        v = model[s] + steps[i]
        v = 2 * hi[s] - v if v > hi[s] else v
        v = 2 * lo[s] - v if v < lo[s] else v
        v = min(v, hi[s])
        model[s] = v
        assert out[i] == v
    np.testing.assert_array_equal(state, model)
    assert (out >= lo[source]).all() and (out <= hi[source]).all()
    with pytest.raises(ValueError, match="source has 5000 rows, steps has 3"):
        reflected_walk(source, steps[:3], state, lo, hi)


def test_batch_round_trip_and_validation():
    b = EventBatch(SCHEMA, np.array([1, 2]), np.array([5, 6]), np.array([0, 1], np.int32),
                   {"f": np.array([1.5, np.nan]), "room": np.array([1, -1], np.int32)})
    evs = b.to_events()
    assert evs[0].attrs == {"f": 1.5, "room": "é" * 20} and evs[1].attrs == {}
    again = EventBatch.from_events(evs, SCHEMA)
    assert again.to_events() == evs
    assert b.columns["n"][0] == MISSING_INT and b.columns["ok"][0] == -1
    with pytest.raises(ValueError, match="column f must be float64"):
        EventBatch(SCHEMA, np.array([1]), np.array([1]), np.array([0], np.int32),
                   {"f": np.array([1], np.int64)})
    with pytest.raises(ValueError, match="needs a dictionary"):
        Schema(("A",), (("s", "str"),))
