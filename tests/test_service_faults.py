"""The streaming service under hostile payloads and damaged state, in-process over a
journal written by the test (no broker needed: what arrives is what the journal holds)."""
import json
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqcep.io.journal import Journal
from dqcep.service import ServiceConfig, StreamingService

ROOT = Path(__file__).resolve().parent.parent
QUERIES = ROOT / "dqcep" / "data" / "iot.cep"


def config(tmp: Path, fmt="msgpack", lateness=0, queries=QUERIES, **kw) -> ServiceConfig:
    return ServiceConfig(queries=str(queries), inputs=["mqtt://127.0.0.1:1/t"],
                         journal=str(tmp / "journal"), checkpoint=str(tmp / "ck.bin"),
                         output=str(tmp / "out.jsonl"), dead_letter=str(tmp / "dead.jsonl"),
                         late=str(tmp / "late.jsonl"), fmt=fmt, lateness=lateness, **kw)


def journal_payloads(tmp: Path, payloads, topic="t") -> None:
    j = Journal(tmp / "journal", fsync="never")
    for p in payloads:
        j.append(topic, p)
    j.commit()
    j.close()


def run_once(cfg: ServiceConfig) -> StreamingService:
    """What the service does with what the journal holds, then a checkpoint (no flush)."""
    svc = StreamingService(cfg)
    while svc.step():
        pass
    svc.checkpoint()
    svc.close()
    return svc


def lines(path: Path) -> list:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_bytes().decode("utf-8").splitlines()]


SURROGATE = {"id": 2, "type": "Temperature", "ts": 1, "room": "\ud800"}


@pytest.mark.parametrize("before", [[], [{"id": 1, "type": "Temperature", "ts": 100,
                                          "room": "r", "value": 40.0}]])
def test_a_lone_surrogate_in_json_is_dead_lettered_not_fatal(tmp_path, before):
    """Alone, and after a later event (so it would otherwise be a late event)."""
    journal_payloads(tmp_path, [json.dumps(e).encode() for e in [*before, SURROGATE]])
    cfg = config(tmp_path, fmt="json")
    svc = run_once(cfg)
    assert svc.counts["payloads"] == len(before) + 1 and svc.counts["malformed"] == 1
    (dead,) = lines(tmp_path / "dead.jsonl")
    assert "lone surrogate" in dead["reason"] and dead["offset"] == len(before)
    assert lines(tmp_path / "late.jsonl") == []
    run_once(cfg)  # restarts from its checkpoint: the payload does not come back
    assert len(lines(tmp_path / "dead.jsonl")) == 1


# strings a JSON text can carry: lone surrogates (as escapes), every other code point
TEXT = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF) | st.characters(),
               max_size=6)
VALUE = st.none() | st.booleans() | st.integers(-2**64, 2**64) | st.floats() | TEXT
EVENT = st.builds(lambda known, other: {**other, **known}, st.fixed_dictionaries(
    {"id": st.integers(0, 50) | TEXT, "type": st.sampled_from(["Temperature", "Smoke", "Door"])
     | TEXT, "ts": st.integers(0, 10_000) | VALUE},
    optional={"room": st.sampled_from(["r1", "r2"]) | TEXT, "value": VALUE,
              "density": VALUE, "open": VALUE}), st.dictionaries(TEXT, VALUE, max_size=2))


def payload_text(obj, ascii_only: bool) -> bytes:
    return json.dumps(obj, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(
    st.builds(payload_text, EVENT, st.booleans()),
    st.builds(payload_text, st.lists(EVENT, max_size=4).map(lambda b: {"events": b}),
              st.booleans()),
    st.binary(max_size=40),
    st.builds(lambda e, junk: payload_text(e, False)[:-1] + junk + b"}", EVENT,
              st.binary(min_size=1, max_size=4))), min_size=1, max_size=12))
def test_fuzzed_json_payloads_never_stop_the_service(tmp_path_factory, payloads):
    tmp = tmp_path_factory.mktemp("svc")
    journal_payloads(tmp, payloads)
    cfg = config(tmp, fmt="json", lateness=5)
    svc = run_once(cfg)
    assert svc.counts["payloads"] == len(payloads)
    for name in ("dead.jsonl", "late.jsonl", "out.jsonl"):
        for line in lines(tmp / name):          # every line is UTF-8 JSON
            assert isinstance(line, dict)
    assert run_once(cfg).counts == svc.counts   # the checkpoint restores, nothing repeats


def rejected_events(record: dict) -> int:
    """How many events a dead-letter record stands for (a whole payload: 1)."""
    if "rejected" not in record:
        return 1
    n = 0
    for group in record["rejected"]:
        for part in group["events"].split(","):
            first, _, last = part.partition("-")
            n += int(last or first) - int(first) + 1
    return n


def test_a_batch_of_bad_events_is_dead_lettered_once(tmp_path):
    """10,000 bad entries in a 10 KB payload: one line, the payload once (was 140 MB)."""
    good = {"id": 1, "type": "Door", "ts": 1, "room": "r", "open": True}
    payloads = [msgpack.packb({"events": [0] * 10_000}),
                msgpack.packb({"events": [dict(good, id=i) if i % 2 else {"id": i, "x": i}
                                          for i in range(2_000)]}),
                msgpack.packb({"events": [{"id": i, "type": "T", "ts": 1, f"k{i}": [i]}
                                          for i in range(100)]}),
                b"\xc1"]
    journal_payloads(tmp_path, payloads)
    svc = run_once(config(tmp_path))
    dead = lines(tmp_path / "dead.jsonl")
    assert [d["offset"] for d in dead] == [0, 1, 2, 3]
    assert [rejected_events(d) for d in dead] == [10_000, 1_000, 100, 1]
    assert svc.counts["malformed"] == 11_101 and svc.counts["events_in"] == 1_000
    assert dead[0]["rejected"] == [{"events": "0-9999",
                                    "reason": "an event must be a map/object, got int"}]
    assert len(dead[2]["rejected"]) == 20 and "81 other reasons" in dead[2]["rejected"][-1]["reason"]
    received = sum(len(p) for p in payloads)
    assert (tmp_path / "dead.jsonl").stat().st_size < 4 * received
