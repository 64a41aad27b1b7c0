"""The streaming service under hostile payloads and damaged state, in-process over a
journal written by the test (no broker needed: what arrives is what the journal holds)."""
import json
import time
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqcep.io.journal import Journal
from dqcep.service import StreamingService
from tests.support.maps import rule_values, toml_of
from tests.support.examples import examples
from tests.support.journal_service import (config, finish, iot_payloads, journal_payloads, lines,
                                           rejected_events, run_once)
from tests.support.paths import ROOT

QUERIES = ROOT / "dqcep" / "data" / "iot.cep"


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


@settings(max_examples=examples(150), deadline=None, suppress_health_check=list(HealthCheck))
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


IOT = iot_payloads(4_000, seed=11, batch=25)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=list(HealthCheck))
@given(as_json=st.lists(st.booleans(), min_size=len(IOT), max_size=len(IOT)),
       repeats=st.lists(st.integers(0, len(IOT) - 1), max_size=6),
       delays=st.lists(st.tuples(st.integers(0, len(IOT) - 1), st.integers(1, 40)),
                       max_size=6))
def test_payloads_read_by_the_kernel_or_in_python_keep_their_place_in_one_batch(
        tmp_path_factory, as_json, repeats, delays):
    """One pending list: msgpack payloads (the kernel) and JSON ones (read in Python)
    mixed at random give the matches, late events and repeats of the same stream sent
    as msgpack alone, with repeated and delayed payloads, whose first copy and arrival
    order decide what is a repeat and what is late."""
    order = list(range(len(IOT)))
    for i, d in delays:  # a payload arrives d payloads later
        order.remove(i)
        order.insert(min(order.index(i - 1) + 1 + d if i else d, len(order)), i)
    for i in repeats:  # and again, later
        order.insert(min(order.index(i) + 7, len(order)), i)

    def outcome(json_at):
        tmp = tmp_path_factory.mktemp("svc")
        journal_payloads(tmp, [json.dumps(msgpack.unpackb(IOT[i])).encode() if json_at[k]
                               else IOT[i] for k, i in enumerate(order)])
        svc = finish(config(tmp, fmt=None, lateness=3))
        return (sorted(json.dumps(m, sort_keys=True) for m in lines(tmp / "out.jsonl")),
                sorted(x["event"]["id"] for x in lines(tmp / "late.jsonl")),
                {k: svc.counts[k] for k in ("events_in", "duplicates", "late", "matches_out")})

    kernel = outcome([False] * len(order))
    assert kernel[0] and kernel[2]["duplicates"] == sum(
        len(msgpack.unpackb(IOT[i])["events"]) for i in repeats)
    assert outcome([as_json[i] for i in order]) == kernel


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
    assert len(dead[2]["rejected"]) == 20
    assert "81 other reasons" in dead[2]["rejected"][-1]["reason"]
    received = sum(len(p) for p in payloads)
    assert (tmp_path / "dead.jsonl").stat().st_size < 4 * received


# ------------------------------------------------- damaged journal and checkpoint
def reference_lines(payloads) -> set:
    from dqcep.core.events import event_from_mapping
    from dqcep.lang import parse_file
    from dqcep.baseline.reference import ReferenceMatcher
    events = [event_from_mapping(e) for p in payloads for e in msgpack.unpackb(p)["events"]]
    return {json.dumps(m.to_json_obj())
            for m in ReferenceMatcher(parse_file(QUERIES).queries).run(events)}


def output(tmp) -> set:
    got = (tmp / "out.jsonl").read_text().splitlines()
    assert len(got) == len(set(got)), "a match was written twice"
    return set(got)


def append(cfg, payloads) -> None:
    """What the MQTT source does while the service runs: journal and commit."""
    svc = StreamingService(cfg)
    for p in payloads:
        svc.journal.append("t", p)
    svc.journal.commit()
    svc.close()


@pytest.mark.parametrize("damage", ["cut open segment", "delete newest segments",
                                    "cut closed segment"])
def test_new_records_after_journal_damage_are_not_skipped(tmp_path, damage):
    """Damage to what was already processed loses nothing; what comes after it is
    processed (it once reused old offsets and was skipped: 63,000-240,000 matches)."""
    first, second = iot_payloads(20_000), iot_payloads(20_000, seed=6, first_id=10**6,
                                                              ts_shift=10**7)
    cfg = config(tmp_path)
    cfg.journal_segment_bytes = 1 << 18 if damage != "cut open segment" else 64 << 20
    cfg.journal_retention = 1 << 40  # keep what was processed: it is what gets damaged
    journal_payloads(tmp_path, first, segment_bytes=cfg.journal_segment_bytes)
    run_once(cfg)
    segs = sorted((tmp_path / "journal").glob("*.seg"), key=lambda p: int(p.stem))
    if damage == "cut open segment":  # as if the service had been killed while writing it
        (victim,) = segs
        for empty in (tmp_path / "journal").glob("*.open"):
            empty.unlink()
        victim.rename(victim.with_suffix(".open"))
        victim = victim.with_suffix(".open")
        with open(victim, "r+b") as f:
            f.truncate(victim.stat().st_size * 6 // 10)
    elif damage == "delete newest segments":
        for seg in segs[-2:]:
            seg.unlink()
    else:
        with open(segs[-2], "r+b") as f:
            f.truncate(segs[-2].stat().st_size // 2)
    append(cfg, second)
    svc = finish(cfg)
    assert output(tmp_path) == reference_lines(first + second)
    assert svc.counts["journal_lost"] == 0  # only records processed before were damaged


def test_a_flipped_byte_loses_one_payload_and_says_so(tmp_path):
    payloads = iot_payloads(20_000)
    journal_payloads(tmp_path, payloads)
    seg = next((tmp_path / "journal").glob("*.*"))
    data = bytearray(seg.read_bytes())
    middle = len(data) // 2
    data[middle] ^= 0x01
    seg.write_bytes(bytes(data))
    from dqcep.io.journal import scan
    hit = [item[3] for item in scan(bytes(data), 0) if item[0] == "record"]
    (lost,) = set(range(len(payloads))) - set(hit)
    svc = finish(config(tmp_path))
    assert output(tmp_path) == reference_lines(payloads[:lost] + payloads[lost + 1:])
    assert svc.counts["journal_lost"] == 1
    (dead,) = lines(tmp_path / "dead.jsonl")
    assert dead["offset"] == lost and dead["records"] == 1 and "damaged" in dead["reason"]


def damaged_checkpoints(good: bytes):
    """(name, bytes): a checkpoint damaged or crafted in the ways an operator meets."""
    from dqcep.io.checkpoint import HEADER, MAGIC
    import zlib
    body = good[HEADER.size:]
    state = msgpack.unpackb(body, raw=False)

    def crafted(**fields):
        b = msgpack.packb({**state, **fields}, use_bin_type=True)
        return HEADER.pack(MAGIC, 3, zlib.crc32(b)) + b
    yield "empty", b""
    yield "header only", good[:HEADER.size]
    yield "cut in half", good[:len(good) // 2]
    yield "flipped byte", good[:200] + bytes([good[200] ^ 0x10]) + good[201:]
    yield "zeros", bytes(len(good))
    yield "random", bytes(range(256)) * 8
    yield "old format", msgpack.packb({**state, "version": 2})
    yield "other version", HEADER.pack(MAGIC, 9, zlib.crc32(body)) + body
    yield "not a map", HEADER.pack(MAGIC, 3, zlib.crc32(b"\x91\x01")) + b"\x91\x01"
    yield "negative offset", crafted(offset=-5)
    yield "offset not int", crafted(offset="7")
    yield "engine missing", crafted(engine=None)
    yield "engine garbage", crafted(engine=b"DQCEPSNAP" + b"\x00" * 50)
    yield "engine of other queries", crafted(engine=b"x" * 100)
    yield "recent ids torn", crafted(recent=b"\x01" * 7)
    yield "counts wrong", crafted(counts={"events_in": "many"})
    yield "sinks missing", crafted(sinks={})
    yield "sink longer than file", crafted(sinks={**state["sinks"], "output": 10**8})


def test_a_damaged_checkpoint_is_refused_with_how_to_recover(tmp_path):
    from dqcep.core.errors import UserError
    payloads = iot_payloads(5_000)
    journal_payloads(tmp_path, payloads)
    cfg = config(tmp_path)
    finish(cfg)
    ck = tmp_path / "ck.bin"
    good = ck.read_bytes()
    want = output(tmp_path)
    for name, data in damaged_checkpoints(good):
        ck.write_bytes(data)
        with pytest.raises(UserError) as err:
            StreamingService(cfg)
        message = str(err.value)
        assert "\n" not in message and ("delete" in message or "put it back" in message), name
        assert (tmp_path / "out.jsonl").stat().st_size == len("".join(
            x + "\n" for x in (tmp_path / "out.jsonl").read_text().splitlines())), name
    ck.write_bytes(good)
    finish(cfg)
    assert output(tmp_path) == want == reference_lines(payloads)


def test_every_recovery_hint_does_what_it_says_when_followed(tmp_path):
    """A damaged checkpoint with a previous one beside it: both hints of the message,
    followed to the letter (the paths taken from the message), start the service and
    end with the reference's matches. 'delete FILE to rebuild' used to resume from
    FILE.prev instead (and skip the rebuild)."""
    import re
    import shutil
    from dqcep.core.errors import UserError
    payloads = iot_payloads(5_000)
    journal_payloads(tmp_path, payloads)
    cfg = config(tmp_path, journal_retention=1 << 40)
    run_once(cfg)
    run_once(cfg)  # ck.bin.prev exists
    assert (tmp_path / "ck.bin.prev").exists()
    saved = tmp_path / "saved"
    shutil.copytree(tmp_path, saved, ignore=shutil.ignore_patterns("saved"))
    for hint in ("resume", "rebuild"):
        for name in ("ck.bin", "ck.bin.prev", "out.jsonl", "dead.jsonl", "late.jsonl"):
            if (saved / name).exists():
                shutil.copy(saved / name, tmp_path / name)
        (tmp_path / "ck.bin").write_bytes(b"damaged")
        with pytest.raises(UserError) as err:
            StreamingService(cfg)
        message = str(err.value)
        if hint == "resume":
            src, dst = re.search(r"move (\S+) to (\S+?);", message).groups()
            Path(src).rename(dst)
        else:
            for path in re.search(r"delete (\S+) and (\S+)$", message).groups():
                Path(path).unlink()
        svc = finish(cfg)
        assert output(tmp_path) == reference_lines(payloads), hint
        if hint == "rebuild":  # from offset 0: every payload again
            assert svc.counts["payloads"] == len(payloads)


def test_the_previous_checkpoint_takes_over_after_a_crash_between_renames(tmp_path):
    payloads = iot_payloads(5_000)
    journal_payloads(tmp_path, payloads)
    cfg = config(tmp_path)
    run_once(cfg)
    (tmp_path / "ck.bin").rename(tmp_path / "ck.bin.prev")
    finish(cfg)
    assert output(tmp_path) == reference_lines(payloads)


def test_losing_the_checkpoint_rebuilds_every_sink_without_repeats(tmp_path):
    """Dead letters and late events once doubled (100 -> 200) when the checkpoint was lost."""
    payloads = iot_payloads(5_000)
    bad = [msgpack.packb({"events": [{"id": 10**7 + i, "ts": 1}]}) for i in range(100)]
    late = [msgpack.packb({"id": 10**8 + i, "type": "Door", "ts": 0}) for i in range(50)]
    journal_payloads(tmp_path, payloads[:10] + bad + late + payloads[10:])
    cfg = config(tmp_path, journal_retention=1 << 40)  # the journal can rebuild it all
    finish(cfg)
    before = {n: (tmp_path / n).read_bytes() for n in ("out.jsonl", "dead.jsonl", "late.jsonl")}
    assert len(lines(tmp_path / "dead.jsonl")) == 100 and len(lines(tmp_path / "late.jsonl")) == 50
    (tmp_path / "ck.bin").unlink()
    (tmp_path / "ck.bin.prev").unlink(missing_ok=True)
    finish(cfg)
    assert {n: (tmp_path / n).read_bytes() for n in before} == before


def test_losing_the_checkpoint_of_a_trimmed_journal_is_refused(tmp_path):
    from dqcep.core.errors import UserError
    journal_payloads(tmp_path, iot_payloads(2_000))
    cfg = config(tmp_path)  # retention 0: processed segments are deleted
    finish(cfg)
    want = (tmp_path / "out.jsonl").read_bytes()
    assert want and not list((tmp_path / "journal").glob("*.seg"))
    (tmp_path / "ck.bin").unlink()
    (tmp_path / "ck.bin.prev").unlink(missing_ok=True)
    with pytest.raises(UserError, match="no longer starts at offset 0"):
        StreamingService(cfg)
    assert (tmp_path / "out.jsonl").read_bytes() == want


def test_processed_segments_are_deleted_but_the_retention(tmp_path):
    """The journal once grew without bound (3.67 GB after 36 M events)."""
    payloads = iot_payloads(20_000)
    journal_payloads(tmp_path, payloads, segment_bytes=1 << 16)
    segs = list((tmp_path / "journal").glob("*.seg"))
    total = sum(p.stat().st_size for p in segs)
    run_once(config(tmp_path, journal_retention=total // 3, journal_segment_bytes=1 << 16))
    kept = sum(p.stat().st_size for p in (tmp_path / "journal").glob("*.seg"))
    assert total // 3 <= kept < total // 3 + (1 << 16) + 30_000
    run_once(config(tmp_path, journal_segment_bytes=1 << 16))  # retention 0
    assert not list((tmp_path / "journal").glob("*.seg"))
    assert output(tmp_path) <= reference_lines(payloads)  # no end of stream: some held


def test_checkpoints_keep_their_interval_while_a_backlog_drains(mosquitto, tmp_path,
                                                                monkeypatch):
    """A backlog once held checkpoints back for its whole length (11-16 s apart). (The
    pace of a slow checkpoint off: the test below has it.) A periodic checkpoint is
    written while the service goes on and the next is due once it is written, so how
    many fall within the drain depends on the machine: more than one, each further on."""
    import threading
    import dqcep.service.streaming as streaming
    monkeypatch.setattr(streaming, "CHECKPOINT_SHARE", 1.0)
    host, port = mosquitto
    journal_payloads(tmp_path, iot_payloads(300_000))
    cfg = config(tmp_path, checkpoint_every=0.001)
    cfg.inputs = [f"mqtt://{host}:{port}/dqcep/backlog"]
    svc = StreamingService(cfg)
    lags = []
    checkpoint = svc.checkpoint

    def recording(**how):
        lags.append(svc.journal.durable_offset - svc.offset)
        checkpoint(**how)
    svc.checkpoint = recording
    stop = threading.Event()
    worker = threading.Thread(target=svc.run, args=(stop,))
    worker.start()
    deadline = time.monotonic() + 60
    while (not lags or lags[-1]) and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    worker.join(30)
    during = [lag for lag in lags if lag > 0]
    assert len(during) >= 2 and during == sorted(during, reverse=True), lags


def test_a_slow_checkpoint_is_paced(tmp_path):
    """Issue 49 item 13: an 857 MB state was rewritten every second. After a checkpoint
    that took 2 s the next is due 18 s later (checkpoints take at most a tenth of the
    time); after a quick one, --checkpoint-every's interval."""
    journal_payloads(tmp_path, iot_payloads(2_000))
    svc = StreamingService(config(tmp_path, checkpoint_every=1.0))
    now = svc._loaded_at
    svc.step()
    assert not svc.checkpoint_due(now + 0.5) and svc.checkpoint_due(now + 1.0)
    svc.checkpoint()
    at = svc.checkpointed_at
    svc._checkpoint_seconds = 0.05  # (as a small state's takes)
    assert not svc.checkpoint_due(at + 0.9) and svc.checkpoint_due(at + 1.0)
    svc._checkpoint_seconds = 2.0
    assert not svc.checkpoint_due(at + 17.9) and svc.checkpoint_due(at + 18.0)
    svc.close()


MESSAGES = st.tuples(
    st.sampled_from(["sensors/r1/Temperature", "sensors/r2/Smoke", "zigbee2mqtt/r1",
                     "tele/r1/SENSOR", "other", "sensors/r1"]),
    st.one_of(st.binary(max_size=40), st.sampled_from([
        b'{"value": 23.5}', b"1", b"ON", b'[{"value": 1}, {"value": 2}, 3]',
        b'{"temperature": 21, "last_seen": 1795687200000}', b'{"last_seen": "x"}',
        b'{"Time": "2026-11-26T10:00:00", "DS18B20": {"Temperature": 21.3}}',
        b'{"Time": "2099-01-01T00:00:00"}', b'{"a": {"b": 1}, "a_b": 2}',
        msgpack.packb({"id": 1, "type": "Temperature", "ts": 5, "room": "r1"}),
        b'{"id": 2, "type": "Smoke", "ts": 9}'])),
    st.none() | st.just(1_795_687_200_000_000))


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(messages=st.lists(MESSAGES, min_size=1, max_size=12),
       mapped=st.none() | st.just("example") | st.lists(rule_values, min_size=1, max_size=3))
def test_random_feeds_never_stop_the_service_and_every_record_is_read_or_dead(
        tmp_path_factory, messages, mapped):
    """Hostile topics, payloads and arrival times, with the example map, a random map
    or none: the service takes every record, and each is events, a dead letter with
    its reason, or both (a part of it)."""
    from dqcep.core.errors import UserError
    from dqcep.io.ingest import PayloadReader
    from dqcep.io.journal import Record
    from dqcep.io.mapping import TopicMap
    tmp = tmp_path_factory.mktemp("feed")
    topic_map = ROOT / "examples" / "sensors.toml"
    if isinstance(mapped, list):
        topic_map = tmp / "random.toml"
        topic_map.write_text(toml_of(mapped))
        try:
            TopicMap.load(topic_map)
        except UserError:
            return  # refused at start with its reason (test_mapping)
    j = Journal(tmp / "journal", fsync="never")
    for topic, payload, arrival in messages:
        j.append(topic, payload, arrival, 1)
    j.close()
    svc = run_once(config(tmp, fmt=None, queries=ROOT / "examples" / "sensors.cep",
                          topic_map=TopicMap.load(topic_map) if mapped else None))
    reader = PayloadReader(None, TopicMap.load(topic_map) if mapped else None)
    read = [reader.read(Record(i, t, p, a, 1)) for i, (t, p, a) in enumerate(messages)]
    dead = lines(tmp / "dead.jsonl")
    assert svc.counts["payloads"] == len(messages) and svc.offset == len(messages)
    assert {d["offset"] for d in dead} == {i for i, (_, bad) in enumerate(read) if bad}
    assert all(d["reason"] for d in dead)
    assert svc.counts["events_in"] + svc.counts["duplicates"] == sum(len(e) for e, _ in read)


def test_the_map_is_parsed_where_it_is_loaded_and_the_service_reads_with_it(
        tmp_path, monkeypatch):
    """``dqcep serve --map`` parses the map once (cli/serve.py) and hands the rules on:
    the service parses nothing more, and a worker (spawned: its configuration pickled)
    gets the rules, not a path to parse again."""
    import pickle
    from dqcep.io.mapping import TopicMap
    topic_map = TopicMap.load(ROOT / "examples" / "sensors.toml")
    parses = []
    real = TopicMap.parse.__func__
    monkeypatch.setattr(TopicMap, "parse", classmethod(
        lambda cls, *a, **k: parses.append(a) or real(cls, *a, **k)))
    j = Journal(tmp_path / "journal", fsync="never")
    j.append("sensors/kitchen/Temperature", b'{"value": 23.5}', 1_795_687_200_000_000, 1)
    j.close()
    cfg = config(tmp_path, fmt=None, queries=ROOT / "examples" / "sensors.cep",
                 topic_map=topic_map)
    svc = run_once(cfg)
    assert svc.counts["events_in"] == 1 and parses == []
    sent = pickle.loads(pickle.dumps(cfg)).topic_map
    assert [r.filter for r in sent.rules] == [r.filter for r in topic_map.rules]
    assert parses == []


def test_return_values_of_events_taken_in_before_a_restart(tmp_path):
    """--returns: a match completed after a restart names an event taken in before it;
    its values come from the checkpoint's kept events."""
    from dqcep.core.events import Event
    from dqcep.lang import parse_file
    from dqcep.baseline.reference import ReferenceMatcher
    queries = tmp_path / "q.cep"
    queries.write_text("QUERY hot PATTERN SEQ(Temperature t, Smoke s) WHERE [room] AND "
                       "t.value > 50 WITHIN 10 s RETURN t.value, t.room, s.density;")
    events = [Event(1, "Temperature", 1000, {"room": "r1", "value": 60.5}),
              Event(2, "Temperature", 1500, {"room": "r2", "value": 70.0}),
              Event(3, "Smoke", 2000, {"room": "r1", "density": 0.3}),
              Event(4, "Smoke", 2500, {"room": "r2", "density": 0.9})]
    cfg = config(tmp_path, queries=queries, returns=True)
    journal_payloads(tmp_path, [msgpack.packb(e.as_mapping()) for e in events[:2]])
    run_once(cfg)                       # a stop after the temperatures: the checkpoint
    journal_payloads(tmp_path, [msgpack.packb(e.as_mapping()) for e in events[2:]])
    svc = run_once(cfg)
    svc = StreamingService(cfg)
    svc.end_stream()
    svc.checkpoint()
    svc.close()
    want = [m.to_json_obj(True) for m in
            ReferenceMatcher(parse_file(queries).queries).run(events)]
    assert sorted(lines(tmp_path / "out.jsonl"), key=json.dumps) == sorted(want, key=json.dumps)
    assert {tuple(m["return"].values()) for m in want} == {(60.5, "r1", 0.3),
                                                           (70.0, "r2", 0.9)}


KLEENE = "QUERY k PATTERN SEQ(A a, B+ b[], C c) WHERE b[i].p > a.p AND c.p < a.p WITHIN 30 ms"


@pytest.mark.parametrize("adapt", [True, False])
def test_the_service_plans_as_dqcep_run_a_kleene_query_over_the_budget_as_joins(
        tmp_path, adapt):
    """The service's engine is dqcep run's (the cost model's plan, moved as it is
    measured): a list tied to its neighbours, which as joins makes 2^15 lists in one
    payload, over a budget of 1024, runs as a chain and is matched; the plan as built
    (``adapt`` off, joins kept) stops it with nothing matched."""
    from dqcep.baseline.reference import ReferenceMatcher
    from dqcep.core.events import Event
    from dqcep.lang import parse

    queries = tmp_path / "k.cep"
    queries.write_text(KLEENE)
    first = [Event(1, "A", 0, {"p": 0})]
    later = [Event(2 + i, "B", 1 + i, {"p": 5}) for i in range(15)]
    later += [Event(20, "C", 17, {"p": 5}), Event(21, "A", 100, {"p": 0}),
              Event(22, "B", 101, {"p": 1}), Event(23, "C", 102, {"p": -1})]
    journal_payloads(tmp_path, [msgpack.packb({"events": [
        {"id": e.id, "type": e.type, "ts": e.ts, **e.attrs} for e in part]})
        for part in (first, later)])
    def norm(events):
        return tuple(sorted((v, tuple(i) if isinstance(i, (list, tuple)) else i)
                            for v, i in events))
    want = {norm(m.events) for m in ReferenceMatcher(parse(KLEENE).queries).run(first + later)}
    cfg = config(tmp_path, queries=queries, budget=1024, adapt=adapt,
                 materialize="auto" if adapt else "always")
    svc = finish(cfg)
    got = {norm(m["events"].items()) for m in lines(tmp_path / "out.jsonl")}
    if adapt:
        assert len(want) == 1 and got == want
        assert svc.engine.stopped == {} and svc.engine.constructions == {"k": "chain"}
    else:
        assert got == set() and list(svc.engine.stopped) == ["k"]


def test_a_service_plans_with_the_rates_its_journal_measures_and_keeps_them(tmp_path):
    """A fresh service whose journal already holds records (a backlog, a worker that
    starts late) plans its queries with the rates of the first events it holds, as
    dqcep run measures a file's; its checkpoint keeps them, so a restart plans the same
    program (even with other --rates); with an empty journal there is nothing to
    measure and the adaptive engine corrects the plan as it goes."""
    from dqcep.core.events import event_from_mapping
    from dqcep.io.checkpoint import write_checkpoint
    from dqcep.io.readers import SAMPLE_EVENTS, rates_of
    from dqcep.service.recovery import CHECKPOINT_VERSION, read_state

    payloads = iot_payloads(30_000, batch=500)
    events = [event_from_mapping(e) for p in payloads for e in msgpack.unpackb(p)["events"]]
    want = rates_of(events[:SAMPLE_EVENTS])
    assert len(want) > 3 and len(set(want.values())) > 1  # measured, not all alike
    journal_payloads(tmp_path, payloads)
    svc = run_once(config(tmp_path, rates={}))  # as dqcep run passes no --rates
    assert svc.engine.source.rates == want
    again = run_once(config(tmp_path, rates={t: 1.0 for t in want}))
    assert again.engine.source.rates == want and again.counts == svc.counts
    # a checkpoint from before the rates were kept: the --rates given
    state = read_state(str(tmp_path / "ck.bin"))
    del state["rates"]
    write_checkpoint(str(tmp_path / "ck.bin"), CHECKPOINT_VERSION, state)
    assert run_once(config(tmp_path, rates=want)).engine.source.rates == want
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_once(config(empty)).engine.source.rates == {}
