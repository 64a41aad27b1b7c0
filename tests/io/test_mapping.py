"""Topic maps (--map): topics and payloads as devices send them -> events."""
from __future__ import annotations

import json
import subprocess
import sys

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dqcep.core.errors import UserError
from dqcep.core.events import Event
from dqcep.io.ingest import PayloadReader
from dqcep.io.journal import Record, Refused
from dqcep.io.mapping import TopicMap, derived_id, filter_matches
from dqcep.io.payloads import decode_payload, detect_format
from tests.support.examples import examples
from tests.support.maps import json_values, rule_values, toml_of
from tests.support.paths import ROOT

ARRIVAL_US = 1_795_687_200_123_456  # 2026-11-26T10:00:00.123456Z
ARRIVAL_MS = ARRIVAL_US // 1000

MAP = """
[[topic]]                     # ESPHome: sensors/<room>/<kind>, {"value": 23.1} or 23.1
filter = "sensors/+/+"
levels = "_/room/type"

[[topic]]                     # zigbee2mqtt: a state object per device
filter = "zigbee2mqtt/+"
levels = "_/device"
type = "Climate"
rename = { temperature = "temp" }

[[topic]]                     # Tasmota: nested objects, a local time without an offset
filter = "tele/+/SENSOR"
levels = "_/device/_"
type = "Probe"
ts = "Time"
ts_zone = "Europe/Berlin"

[[topic]]                     # epoch seconds, ids of the device's own
filter = "lab/#"
type = "Lab"
ts = "t"
ts_unit = "s"
id = "seq"
"""


def rec(topic, payload, offset=7, arrival=ARRIVAL_US):
    return Record(offset, topic, payload, arrival, 1)


def read(topic, payload, **kw):
    return TopicMap.parse(MAP).read(rec(topic, payload, **kw))


def test_esphome_value_objects_and_bare_values():
    events, bad = read("sensors/r1/Temperature", b'{"value": 23.1}')
    assert bad == [] and events == [Event(derived_id(7, 0), "Temperature", ARRIVAL_MS,
                                          {"value": 23.1, "room": "r1"})]
    events, bad = read("sensors/r2/Smoke", b"1")
    assert bad == [] and events[0].attrs == {"value": 1, "room": "r2"}
    events, _ = read("sensors/r2/Door", b" ON\n")
    assert events[0].attrs["value"] == "ON"
    events, _ = read("sensors/r2/Door", b"true")
    assert events[0].attrs["value"] is True


def test_zigbee2mqtt_state_object_with_rename_and_nesting():
    payload = json.dumps({"temperature": 21.5, "humidity": 40, "battery": 90,
                          "update": {"state": "idle"}, "color": [1, 2], "id": "x"}).encode()
    events, bad = read("zigbee2mqtt/kitchen", payload)
    assert bad == []
    assert events[0].type == "Climate" and events[0].attrs == {
        "temp": 21.5, "humidity": 40, "battery": 90, "update_state": "idle",
        "color_0": 1, "color_1": 2, "device": "kitchen"}   # a payload "id" is no attribute


def test_tasmota_nested_object_and_local_time():
    payload = b'{"Time": "2026-11-26T10:00:00", "DS18B20": {"Temperature": 21.3}}'
    events, bad = read("tele/probe1/SENSOR", payload)
    assert bad == []
    # 10:00 in Berlin (UTC+1 in November) is 09:00 UTC
    assert events[0].ts == 1_795_683_600_000
    assert events[0].attrs == {"DS18B20_Temperature": 21.3, "device": "probe1"}


def test_local_times_across_the_end_of_summer_time_keep_their_order():
    """Issue 49 item 7: the hour Berlin's clocks pass twice (2026-10-25, 02:00-03:00)
    was read as its first pass: of 15 readings every 10 minutes, 5 went an hour back
    (late). A repeated local time is the pass nearer its arrival; without an arrival,
    the first pass; the hour skipped in spring has the offset from before it."""
    from datetime import datetime, timedelta, timezone
    from zoneinfo import ZoneInfo
    berlin = ZoneInfo("Europe/Berlin")
    start = datetime(2026, 10, 25, 0, 10, tzinfo=timezone.utc)  # 02:10 CEST
    taken = [start + timedelta(minutes=10 * i) for i in range(15)]
    got = []
    for t in taken:
        local = t.astimezone(berlin).replace(tzinfo=None).isoformat()
        arrival = int(t.timestamp() * 1_000_000) + 400_000  # sent as taken
        events, bad = read("tele/p1/SENSOR", json.dumps({"Time": local}).encode(),
                           arrival=arrival)
        assert bad == []
        got.append(events[0].ts)
    assert got == [int(t.timestamp() * 1000) for t in taken]
    assert len({t.astimezone(berlin).replace(tzinfo=None) for t in taken}) < 15  # repeated
    # no arrival (a journal before format 2): the first pass
    events, _ = read("tele/p1/SENSOR", b'{"Time": "2026-10-25T02:30:00"}', arrival=None)
    assert events[0].ts == int(datetime(2026, 10, 25, 0, 30, tzinfo=timezone.utc)
                               .timestamp() * 1000)
    # 02:30 on 2026-03-29 is no Berlin time: read at UTC+1, as 01:30 UTC
    events, _ = read("tele/p1/SENSOR", b'{"Time": "2026-03-29T02:30:00"}')
    assert events[0].ts == int(datetime(2026, 3, 29, 1, 30, tzinfo=timezone.utc)
                               .timestamp() * 1000)


def test_arrays_epoch_seconds_and_device_ids():
    payload = json.dumps([{"t": 1764151200.5, "seq": 10, "v": 1},
                          {"t": "1764151201", "seq": 11, "v": 2},
                          {"t": True, "seq": 12}]).encode()
    from dqcep.io.mapping import device_id
    events, bad = read("lab/a/b", payload)
    assert [(e.id, e.ts, e.attrs) for e in events] == [
        (device_id("lab/a/b", 10), 1_764_151_200_500, {"v": 1}),
        (device_id("lab/a/b", 11), 1_764_151_201_000, {"v": 2})]
    assert [(r.index, r.reason) for r in bad] == [
        (2, "rule 4 (lab/#): the time field 't' holds True, no time")]


@pytest.mark.integration
def test_two_devices_that_both_count_from_one_keep_all_their_readings():
    """Issue 49 item 5: with `id = "seq"` two devices each counting 1..50 lost 50 of 100
    readings as repeats. A device's number is unique on its topic: the same number on
    another topic is a reading of its own, on the same topic (a redelivery) a repeat."""
    from dqcep._kernels.recent_ids import RecentIds
    from dqcep.io.mapping import device_id
    ids = [read(f"lab/dev{d}", json.dumps({"t": n, "seq": n, "v": d}).encode())[0][0].id
           for d in (1, 2) for n in range(1, 51)]
    recent = RecentIds(4096)
    kept = recent.admit(np.array(ids, np.int64))
    assert int(np.count_nonzero(kept)) == 100 and len(set(ids)) == 100
    again = read("lab/dev1", json.dumps({"t": 7, "seq": 7}).encode())[0][0].id
    assert again == ids[6] and not recent.admit(np.array([again], np.int64)).any()
    # the same in every process (no salted hash), within int64, above derived ids
    out = subprocess.run([sys.executable, "-c", "from dqcep.io.mapping import device_id; "
                          "print(device_id('lab/dev1', 1))"], capture_output=True, text=True)
    assert int(out.stdout) == device_id("lab/dev1", 1)
    assert all(2 ** 62 <= i < 2 ** 63 for i in ids)


def test_what_no_rule_can_read_is_rejected_with_the_rule_and_the_reason():
    assert read("other/topic", b"1")[1][0].reason == \
        "no [[topic]] rule of the map matches the topic 'other/topic'"
    assert "rule 1 (sensors/+/+): not valid json" in \
        read("sensors/r1/T", b'{"value": ')[1][0].reason
    assert read("lab/x", b'{"t": 1}')[1][0].reason == \
        "rule 4 (lab/#): no field 'seq' in the payload"
    assert read("zigbee2mqtt/k", b'{"a": {"b": 1}, "a_b": 2}')[1][0].reason == \
        "rule 2 (zigbee2mqtt/+): two fields flatten to the attribute 'a_b'"
    assert "exceeds" in read("sensors/r1/T", Refused(10**9))[1][0].reason
    events, bad = read("sensors/r1/T", b'{"value": 1}', arrival=None)
    assert events == [] and "no arrival time" in bad[0].reason


def test_msgpack_payloads_are_detected_too():
    events, bad = read("zigbee2mqtt/k", msgpack.packb({"temperature": 20}))
    assert bad == [] and events[0].attrs == {"temp": 20, "device": "k"}


@pytest.mark.parametrize("text, message", [
    ("x = 1", "unknown key 'x'"),
    ("", "has no [[topic]] rule"),
    ("[[topic]]\nlevels = 'a'", "has no filter"),
    ("[[topic]]\nfilter = 'a/+x'", "'+' must be a whole level"),
    ("[[topic]]\nfilter = 'a/+'\nlevels = 'a'", "names 1 levels, the filter has 2"),
    ("[[topic]]\nfilter = 'a/+'\nlevels = 'a/ts'", "'ts' is no attribute name"),
    ("[[topic]]\nfilter = 'a/+'\nformat = 'xml'", "format 'xml' is not one of"),
    ("[[topic]]\nfilter = 'a'\nts_unit = 's'", "ts_unit without ts"),
    ("[[topic]]\nfilter = 'a'\nts = 't'\nts_unit = 'h'", "ts_unit 'h' is not one of"),
    ("[[topic]]\nfilter = 'a'\nts_zone = 'Mars/Olympus'", "is no time zone"),
    ("[[topic]]\nfilter = 'a'\nrename = { a = 'id' }", "'id' is no attribute name"),
    ("[[topic]]\nfilter = 'a'\nfilters = 'b'", "unknown key 'filters'"),
    ("[[topic]\n", "not valid TOML"),
])
def test_a_bad_map_file_is_refused_naming_the_rule(text, message):
    with pytest.raises(UserError) as err:
        TopicMap.parse(text, "map.toml")
    assert str(err.value).startswith("map.toml") and message in str(err.value)


def test_filters_match_as_mqtt_says():
    def m(flt, topic):
        return filter_matches(flt.split("/"), topic.split("/"))
    assert m("a/+/c", "a/b/c") and not m("a/+/c", "a/b/c/d") and m("a/#", "a")
    assert m("a/#", "a/b/c") and not m("+/x", "$SYS/x") and m("$SYS/x", "$SYS/x")


def test_format_detection_and_the_flag_a_dead_letter_names():
    assert detect_format(b' {"a": 1}') == "json" and detect_format(b"[1]") == "json"
    assert detect_format(msgpack.packb({"a": 1})) == "msgpack"
    assert detect_format(msgpack.packb([1])) == "msgpack" and detect_format(b"23.1") is None
    event = {"id": 1, "type": "T", "ts": 5}
    for payload in (json.dumps(event).encode(), msgpack.packb(event)):
        assert decode_payload(payload) == ([Event(1, "T", 5)], [])
    _, bad = decode_payload(json.dumps(event).encode(), "msgpack")
    assert "looks like json: leave --format out (payloads are detected) or pass " \
           "--format json" in bad[0].reason
    _, bad = decode_payload(msgpack.packb(event), "json")
    assert "pass --format msgpack" in bad[0].reason
    _, bad = decode_payload(b"23.1")
    assert "a bare value needs a [[topic]] rule (--map)" in bad[0].reason


def test_events_ahead_of_their_arrival_are_rejected():
    reader = PayloadReader(max_future=60_000)
    ok = {"id": 1, "type": "T", "ts": ARRIVAL_MS + 60_000}
    ahead = {"id": 2, "type": "T", "ts": ARRIVAL_MS + 60_001}
    events, bad = reader.read(rec("t", json.dumps({"events": [ok, "x", ahead]}).encode()))
    assert [e.id for e in events] == [1]
    assert [r.index for r in bad] == [1, 2]
    assert bad[0].reason == "an event must be a map/object, got str"
    assert bad[1].reason.startswith(f"event ts {ARRIVAL_MS + 60_001} is ahead of its arrival")
    assert "by 60,001 ms, more than --max-future 60,000 ms" in bad[1].reason
    events, bad = reader.read(rec("t", json.dumps(ahead).encode()))
    assert events == [] and bad[0].index is None
    assert PayloadReader(max_future=0).read(rec("t", json.dumps(ahead).encode()))[0]
    assert reader.read(rec("t", json.dumps(ahead).encode(), arrival=None))[0]  # unknown


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules=st.lists(rule_values, min_size=1, max_size=3),
       topic=st.sampled_from(["s/r1/T", "s/r1", "x", "y/z", "s/r2/U/extra"]),
       body=json_values, shape=st.sampled_from(["json", "msgpack", "raw"]),
       arrival=st.none() | st.just(ARRIVAL_US))
def test_random_maps_and_payloads_map_or_say_why(rules, topic, body, shape, arrival):
    try:
        topic_map = TopicMap.parse(toml_of(rules))
    except UserError:
        return  # a map refused with its reason (levels that do not fit the filter)
    if shape == "json":
        payload = json.dumps(body).encode()
    elif shape == "msgpack":
        try:
            payload = msgpack.packb(body)
        except (OverflowError, ValueError):
            return
    else:
        payload = str(body).encode()
    events, bad = PayloadReader(topic_map=topic_map).read(rec(topic, payload, arrival=arrival))
    assert all(isinstance(e, Event) for e in events)
    assert all(r.reason for r in bad)
    assert events or bad or body == []  # mapped (an empty array: no event) or rejected


@pytest.mark.integration
def test_a_map_nested_too_deeply_is_refused_with_a_line_not_a_traceback(tmp_path):
    """Issue 49 item 17: a deeply nested TOML map raised RecursionError (exit 1)."""
    deep = tmp_path / "deep.toml"
    deep.write_text('[[topic]]\nfilter = "a/#"\nrename = ' + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(UserError, match="nested too deeply"):
        TopicMap.load(deep)
    r = subprocess.run([sys.executable, "-m", "dqcep", "run", "examples/fire.cep", "--input",
                        "mqtt://127.0.0.1:9/a/#", "-o", str(tmp_path / "o.jsonl"), "--map",
                        str(deep)], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert r.returncode == 2 and "nested too deeply" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------ the compiled map
KERNEL_QUERY = ("PATTERN SEQ(Temperature a, Humidity b) WHERE a.value > b.value AND "
                "a.room = b.room AND a.unit = 'C' AND b.ok = true AND b.events >= 0 "
                "WITHIN 10")  # (events: a msgpack batch's key, an attribute to the map)
KERNEL_MAP = """
[[topic]]
filter = "sensors/+/+"
levels = "_/room/type"
[[topic]]
filter = "fixed/#"
type = "Temperature"
format = "value"
[[topic]]
filter = "json/+/+"
levels = "_/type/unit"
format = "json"
[[topic]]
filter = "timed/+"
levels = "_/type"
ts = "t"
[[topic]]
filter = "untyped/+"
levels = "_/room"
"""
KERNEL_TOPICS = ["sensors/r1/Temperature", "sensors/r2/Humidity", "sensors/r1/Other",
                 "sensors//Temperature", "sensors/ü/Humidity", "fixed/a", "json/Humidity/F",
                 "timed/Temperature", "untyped/r1", "nomatch/x", "sensors/r1"]
MEMBER_VALUES = st.one_of(
    st.sampled_from(["1", "-0", "23.5", "1e3", "-2.5E-3", "12345678901234567890", "01",
                     "1e400", "NaN", "true", "false", "null", '"C"', '"F"', '"é"', '"a\\"b"',
                     '"\\u00e9"', '"\x01"', "{}", '{"x": 1}', "[1, 2]", "-", "1.", '"r9"']),
    st.integers(-2**63, 2**64).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr))
MEMBERS = st.lists(st.tuples(st.sampled_from(["value", "unit", "ok", "room", "type", "ts",
                                              "id", "other", "é", "", "events", "t"]),
                             MEMBER_VALUES), max_size=4)
SPACE = st.sampled_from(["", " ", "\n\t", "\r "])


@st.composite
def kernel_payloads(draw):
    kind = draw(st.integers(0, 2))
    if kind == 0:
        members = draw(MEMBERS)
        s1, s2 = draw(SPACE), draw(SPACE)
        body = ("," + s1).join(f'"{k}"{s2}:{s1}{v}' for k, v in members)
        return f"{s1}{{{s2}{body}{s1}}}{s2}".encode()
    if kind == 1:
        return (draw(SPACE) + draw(MEMBER_VALUES) + draw(SPACE)).encode()
    return draw(st.sampled_from([b"", b"on", b"\xff", b"\x81\xa5value\x01", b"[1]",
                                 b"\x0b7", b"7\x1f", b" 7 x", "\u00a07".encode()]))


def journal_block(tmp_path_factory, records):
    """A journal of ``records`` (topic, payload, arrival, refused) and one block of all
    of them, as a consumer reads it."""
    from dqcep.io.journal import Journal
    from dqcep.io.journal_tail import JournalTail
    journal = Journal(tmp_path_factory.mktemp("journal"), fsync="never")
    for topic, payload, arrival, refused in records:
        journal.append(topic, Refused(len(payload)) if refused else payload, arrival, 1)
    journal.commit()
    block = JournalTail(journal.dir).block(journal.durable_offset, 1 << 20, "$dqcep/control")
    assert block is not None and block.count == len(records)
    return journal, block


@settings(max_examples=examples(400), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from(KERNEL_TOPICS), kernel_payloads(),
                          st.sampled_from([ARRIVAL_US, ARRIVAL_US + 1999, None]),
                          st.booleans()), min_size=1, max_size=25))
def test_the_compiled_map_reads_what_the_map_reads(tmp_path_factory, records):
    """MappedColumns on a RecordBlock against TopicMap.read and the engine's columns:
    every record it takes gives the row the map's one event gives; it leaves to Python
    every record the map rejects or reads otherwise."""
    from dqcep.io.mapping import MappedColumns
    from dqcep.lang import parse
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine
    engine = Engine(build_plan(parse(KERNEL_QUERY).queries))
    topic_map = TopicMap.parse(KERNEL_MAP, "map.toml")
    journal, block = journal_block(tmp_path_factory, records)
    decoder = engine.column_decoder()
    mapped = MappedColumns(topic_map, decoder, engine.types, engine.attrs)
    rows = np.zeros(block.count, np.int64)
    taken, i = [], 0
    while i < block.count:
        j = mapped.decode(block, i, rows)
        taken += range(i, j)
        i = j + 1  # record j: for the map in Python
    events = []
    for k in taken:
        record = block.record(k)
        assert record == next(journal.read(k))
        got, rejected = topic_map.read(record)
        assert len(got) == 1 and not rejected, (record, got, rejected)
        events += got
    assert rows.tolist() == [1 if k in taken else 0 for k in range(block.count)]
    fast, slow = decoder.take(), engine.columns(events)
    for name, a, b in zip(("ts", "id", "type", "val", "kind"), fast, slow):
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    # what a device sends most is for the kernel
    plain = [k for k, (t, p, a, r) in enumerate(records)
             if t == "sensors/r1/Temperature" and p in (b'{"value": 1}', b"1") and a and not r]
    assert set(plain) <= set(taken)
    # the same records as msgpack event maps (dqcep spark stream's rows): every one the
    # kernel writes is what msgpack writes of the map's event
    encoded = encoded_events(topic_map, block)
    assert set(plain) <= set(encoded)
    for k, blob in encoded.items():
        got, rejected = topic_map.read(block.record(k))
        assert len(got) == 1 and not rejected
        assert blob == msgpack.packb(got[0].as_mapping()), (block.record(k), got)
    journal.close()


OTHER_QUERY = ("PATTERN SEQ(Humidity h, Other o) WHERE o.unit = h.unit AND o.value > 1 "
               "WITHIN 10")  # other types, other columns in another order


@settings(max_examples=examples(200), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from(KERNEL_TOPICS), kernel_payloads(),
                          st.sampled_from([ARRIVAL_US, None]), st.booleans()),
                min_size=1, max_size=25), st.integers(0, 3))
@example([("sensors/r1/Temperature", b'{"value": 1}', ARRIVAL_US, False),
          ("sensors/r1/Temperature", b"", ARRIVAL_US, False),  # for Python: two runs
          ("sensors/r1/Temperature", b'{"value": 2}', ARRIVAL_US, False)], 1)
def test_a_shared_reading_gives_each_consumer_what_its_own_compiled_map_gives(
        tmp_path_factory, records, sweep_at):
    """A worker's consumers share one reading of a block (``SharedReading``), each taking
    it in its engine's codes (``Recoding``): the same stops, rows and columns as its own
    ``MappedColumns`` over its own decoder, for engines of other types, columns and
    strings, and after its dictionary freed codes (a sweep) between two runs."""
    from dqcep._kernels.store import KINDS
    from dqcep.io.mapping import MappedColumns, Recoding, SharedReading
    from dqcep.lang import parse
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine
    topic_map = TopicMap.parse(KERNEL_MAP, "map.toml")
    journal, block = journal_block(tmp_path_factory, records)
    shared = SharedReading(topic_map)
    for text in (KERNEL_QUERY, OTHER_QUERY):
        own, mine = (Engine(build_plan(parse(text).queries)) for _ in range(2))
        for engine in (own, mine):  # a string coded before: codes differ from the shared
            engine.dictionary.code("r9")
        mapped = MappedColumns(topic_map, own.column_decoder(), own.types, own.attrs)
        recoding = Recoding(shared, mine.column_decoder(), mine.types, mine.attrs,
                            mine.dictionary)
        rows, i, runs = np.zeros(block.count, np.int64), 0, 0
        while i < block.count:
            j = mapped.decode(block, i, rows)
            run = shared.read(block, i)
            assert run.stop == j and np.array_equal(run.rows[i:j], rows[i:j])
            if j > i:  # the same cells; strings by value (coded in another order)
                expect, got = own.column_decoder().take(), recoding.columns(run)
                for name, a, b in zip(("ts", "id", "type", "val", "kind"), expect, got):
                    assert a.dtype == b.dtype and a.shape == b.shape, name
                    if name != "val":
                        assert np.array_equal(a, b), name
                text = expect[4] == KINDS["STR"]
                assert np.array_equal(expect[3][~text], got[3][~text])
                assert [own.dictionary.values[int(c)] for c in expect[3][text]] == \
                    [mine.dictionary.values[int(c)] for c in got[3][text]]
                runs += 1
                if runs == sweep_at:  # every string code freed in both engines, and
                    for engine in (own, mine):  # one taken again by another string
                        if engine.dictionary.sweep(np.zeros(0, np.int64)):
                            engine.column_decoder().forget_strings()
                        engine.dictionary.code("after the sweep")
            i = j + 1
    journal.close()


def encoded_events(topic_map, block) -> dict[int, bytes]:
    """MappedColumns.encode over a block, in a small buffer (so that it fills): record
    -> its event map, for the records it writes."""
    from dqcep._kernels.map_decode import FULL
    from dqcep._kernels.msgpack_decode import ColumnDecoder
    from dqcep.io.mapping import MappedColumns
    mapped = MappedColumns(topic_map, ColumnDecoder([], [], None), [], [])
    out = np.empty(1200, np.uint8)
    ends, ids, ts = (np.zeros(block.count, np.int64) for _ in range(3))
    encoded, i = {}, 0
    while i < block.count:
        j, why, at = mapped.encode(block, i, out, 0, ends, ids, ts)
        for k in range(i, j):
            encoded[k] = out[ends[k - 1] if k > i else 0:ends[k]].tobytes()
            assert ids[k] == (block.first + k) << 24
        if why == FULL and j == i:
            out = np.empty(2 * len(out), np.uint8)
        i = j if why == FULL else j + 1
    return encoded


def test_the_compiled_map_takes_the_docs_feed():
    """The docs' shapes of one reading a message are all for the kernel."""
    from dqcep.io.journal import frame_record
    from dqcep.io.journal_tail import RecordBlock
    from dqcep.io.mapping import MappedColumns
    from dqcep.lang import parse
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine
    engine = Engine(build_plan(parse(KERNEL_QUERY).queries))
    topic_map = TopicMap.parse(KERNEL_MAP, "map.toml")
    payloads = [b'{"value": 23.1}', b"23.1", b'{"value": 21, "unit": "C"}', b"true",
                b' {"ok": false, "room": "x"} ']
    data = b"".join(frame_record(i, "sensors/r1/Humidity", p, ARRIVAL_US, i + 1)
                    for i, p in enumerate(payloads))
    from dqcep._kernels.journal_records import scan_records
    spans = np.empty((len(payloads), 6), np.int64)
    assert scan_records(data, 0, 0, len(payloads), b"", spans)[1] == len(payloads)
    block = RecordBlock(data, 0, spans)
    decoder = engine.column_decoder()
    rows = np.zeros(len(payloads), np.int64)
    assert MappedColumns(topic_map, decoder, engine.types, engine.attrs).decode(
        block, 0, rows) == len(payloads)
    ts, ids, types, val, kind = decoder.take()
    assert ts.tolist() == [ARRIVAL_MS] * 5 and ids.tolist() == [i << 24 for i in range(5)]
    room = engine.attrs.index("room")
    assert val[4, room] == engine.dictionary.code("r1")  # the topic's level wins
