"""Map rules by content (issue 53): conditions on the payload, several events per
message (a type each), topic-level captures, attributes from fields, names a query
can give, and what a dead letter says first."""
from __future__ import annotations

import json

import pytest

from dqcep.core.errors import UserError
from dqcep.io.journal import Record
from dqcep.io.mapping import TopicMap, clean_name, device_id

ARRIVAL_US = 1_795_687_200_123_456
ARRIVAL_MS = ARRIVAL_US // 1000

SHELLY = """
[[topic]]                          # Shelly Plus H&T Gen2: NotifyStatus, one reading each
filter = "+/events/rpc"
levels = "device/_/_"
when = { method = "NotifyStatus" }
ts = "params.ts"
ts_unit = "s"

[[topic.event]]
type = "Temperature"
from = "params.temperature:0"

[[topic.event]]
type = "Humidity"
from = "params.humidity:0"

[[topic.event]]
type = "Battery"
from = "params.devicepower:0"
rename = { battery_percent = "percent" }
"""

TTN = """
[[topic]]                          # The Things Network v3 uplinks: doors and rooms
filter = "v3/+/devices/+/up"
levels = "_/app/_/device/_"
ts = "received_at"
attrs = { gateway = "uplink_message.rx_metadata.0.gateway_ids.gateway_id" }

[[topic.event]]
type = "Door"
from = "uplink_message.decoded_payload"
has = ["uplink_message.decoded_payload.contact"]

[[topic.event]]
type = "Climate"
from = "uplink_message.decoded_payload"
has = ["uplink_message.decoded_payload.temperature"]
"""


def read(text, topic, payload, offset=7, arrival=ARRIVAL_US):
    topic_map = TopicMap.parse(text, "map.toml")
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return topic_map.read(Record(offset, topic, data, arrival, 1))


def shelly(params, method="NotifyStatus"):
    return {"src": "shellyplusht-08b61fcb7f3c", "dst": "shellyplusht/events",
            "method": method, "params": {"ts": 1700000000.25, **params}}


def test_one_shelly_message_per_reading_gives_an_event_of_its_type():
    events, bad = read(SHELLY, "shellyplusht-1/events/rpc",
                       shelly({"temperature:0": {"id": 0, "tC": 21.5, "tF": 70.7}}))
    assert bad == [] and [(e.type, e.ts, e.attrs) for e in events] == [
        ("Temperature", 1700000000250, {"tC": 21.5, "tF": 70.7, "device": "shellyplusht-1"})]
    events, bad = read(SHELLY, "shellyplusht-1/events/rpc", shelly({
        "humidity:0": {"id": 0, "rh": 45.2},
        "devicepower:0": {"id": 0, "battery": {"V": 5.9, "percent": 86}}}))
    assert bad == [] and [(e.type, e.attrs) for e in events] == [
        ("Humidity", {"rh": 45.2, "device": "shellyplusht-1"}),
        ("Battery", {"battery_V": 5.9, "percent": 86, "device": "shellyplusht-1"})]
    assert len({e.id for e in events}) == 2  # one message, two events, ids of their own


def test_a_message_no_rule_or_table_applies_to_says_what_failed():
    _, bad = read(SHELLY, "shellyplusht-1/events/rpc", shelly({}, method="NotifyEvent"))
    assert bad[0].reason == ("no [[topic]] rule applies: rule 1 (+/events/rpc): field "
                             "'method' is \"NotifyEvent\", not \"NotifyStatus\"")
    _, bad = read(SHELLY, "shellyplusht-1/events/rpc", shelly({"sys": {"uptime": 5}}))
    assert bad[0].reason == (
        "rule 1 (+/events/rpc): no [[topic.event]] table applies: event 1 (Temperature): no "
        "field 'params.temperature:0'; event 2 (Humidity): no field 'params.humidity:0'; "
        "event 3 (Battery): no field 'params.devicepower:0'")


def test_ttn_uplinks_become_doors_or_rooms_by_their_decoded_payload():
    def uplink(decoded):
        return {"end_device_ids": {"device_id": "x"}, "received_at":
                "2026-11-26T10:00:00.5Z", "uplink_message": {
                    "decoded_payload": decoded,
                    "rx_metadata": [{"gateway_ids": {"gateway_id": "gw-7"}}]}}
    events, bad = read(TTN, "v3/app@ttn/devices/door-1/up", uplink({"contact": False}))
    assert bad == [] and [(e.type, e.attrs) for e in events] == [
        ("Door", {"contact": False, "gateway": "gw-7", "app": "app@ttn", "device": "door-1"})]
    assert events[0].ts == 1795687200500
    events, _ = read(TTN, "v3/app@ttn/devices/room-1/up",
                     uplink({"temperature": 21.0, "humidity": 40}))
    assert [e.type for e in events] == ["Climate"]


def test_topic_levels_captured_by_a_pattern():
    text = """
[[topic]]
filter = "home/+"
levels = "_/{room}_co2"
type = "CO2"

[[topic]]
filter = "home/+"
levels = "_/{room}-{type}"
"""
    events, bad = read(text, "home/kitchen_co2", b"812")
    assert bad == [] and events[0].type == "CO2" and events[0].attrs == {
        "value": 812, "room": "kitchen"}
    events, bad = read(text, "home/hall-Temperature", b"20.5")  # the second rule, type too
    assert bad == [] and (events[0].type, events[0].attrs) == (
        "Temperature", {"value": 20.5, "room": "hall"})
    _, bad = read(text, "home/attic", b"1")
    assert bad[0].reason == ("no [[topic]] rule of map.toml matches the topic 'home/attic'; "
                             "rule 1 (home/+): its levels do not fit; rule 2 (home/+): its "
                             "levels do not fit")


def test_names_no_query_can_give_are_cleaned_or_counted():
    text = """
[[topic]]
filter = "a/+"
levels = "_/type"
"""
    topic_map = TopicMap.parse(text, "map.toml")
    payload = json.dumps({"temperature:0": {"tC": 20}, "ok": True}).encode()
    events, _ = topic_map.read(Record(1, "a/T", payload, ARRIVAL_US, 1))
    assert events[0].attrs == {"temperature:0_tC": 20, "ok": True}  # kept as it is
    assert topic_map.unnamable_lines() == [
        "rule 1 (a/+): the attribute 'temperature:0_tC' (1 event(s)) is no name a query "
        "can give: rename = { \"temperature:0_tC\" = \"temperature_0_tC\" } or names = "
        "\"clean\""]
    events, _ = read(text + 'names = "clean"\n', "a/T", payload)
    assert events[0].attrs == {"temperature_0_tC": 20, "ok": True}
    events, _ = read(text + 'rename = { "temperature:0.tC" = "celsius" }\n', "a/T", payload)
    assert events[0].attrs == {"celsius": 20, "ok": True}
    assert clean_name("1st value") == "_1st_value" and clean_name("a-b.c") == "a_b_c"
    _, bad = read(text + 'names = "clean"\n', "a/T", b'{"a-b": 1, "a_b": 2}')
    assert "two fields give the attribute 'a_b'" in bad[0].reason


def test_a_dead_letter_says_first_that_the_payload_is_no_json():
    text = '[[topic]]\nfilter = "ttn/+"\ntype = "Up"\nts = "received_at"\n'
    _, bad = read(text, "ttn/x", b"not json")
    assert bad[0].reason == ("rule 1 (ttn/+): the payload is neither JSON nor msgpack "
                             "(starts b'not json'); the rule reads its fields")


def test_conditions_compare_as_the_language_does():
    text = '[[topic]]\nfilter = "t"\ntype = "T"\nwhen = { n = 1, b = true, s = "1" }\n'
    assert read(text, "t", {"n": 1.0, "b": True, "s": "1"})[0]
    for other in ({"n": True, "b": True, "s": "1"}, {"n": 1, "b": 1, "s": "1"},
                  {"n": 1, "b": True, "s": 1}, {"n": 1, "b": True}):
        assert not read(text, "t", other)[0]


def test_event_tables_of_device_numbered_readings_have_ids_of_their_own():
    text = SHELLY.replace('ts_unit = "s"\n', 'ts_unit = "s"\nid = "id"\n')
    payload = dict(shelly({"humidity:0": {"rh": 1}, "devicepower:0": {"battery": 2}}), id=5)
    events, bad = read(text, "d/events/rpc", payload)
    assert bad == [] and [e.id for e in events] == [device_id("d/events/rpc", 5, 2),
                                                    device_id("d/events/rpc", 5, 3)]


@pytest.mark.parametrize("text, message", [
    ('[[topic]]\nfilter = "a/+"\nlevels = "_/{room"', "braces must pair"),
    ('[[topic]]\nfilter = "a/+"\nlevels = "_/{ts}_x"', "'ts' is no attribute name"),
    ('[[topic]]\nfilter = "a/+"\nlevels = "room/{room}"', "names 'room' twice"),
    ('[[topic]]\nfilter = "a"\nwhen = 3', "when must be a table"),
    ('[[topic]]\nfilter = "a"\nwhen = { a = [1] }', "a value is a string, number or boolean"),
    ('[[topic]]\nfilter = "a"\nhas = "x"', "has must be a list of fields"),
    ('[[topic]]\nfilter = "a"\nattrs = { "a-b" = "x" }', "'a-b' is no attribute name"),
    ('[[topic]]\nfilter = "a"\nnames = "fix"', "names 'fix' is not one of keep, clean"),
    ('[[topic]]\nfilter = "a"\ntype = "Door open"', "'Door open' is no event type"),
    ('[[topic]]\nfilter = "a"\nrename = { "x" = "a:b" }', "'a:b' is no attribute name"),
    ('[[topic]]\nfilter = "a"\n[[topic.event]]\nkind = "x"', "[[topic.event]] 1: unknown "
     "key 'kind'"),
    ('[[topic]]\nfilter = "a"\n[[topic.event]]\nfrom = ""', "from must be a non-empty"),
])
def test_a_map_that_would_make_names_no_query_can_give_is_refused(text, message):
    with pytest.raises(UserError) as err:
        TopicMap.parse(text, "map.toml")
    assert str(err.value).startswith("map.toml") and message in str(err.value), str(err.value)


def test_the_kernel_reads_only_rules_that_read_every_payload_alike():
    topic_map = TopicMap.parse(SHELLY + '\n[[topic]]\nfilter = "x/+"\nlevels = "_/type"\n')
    assert topic_map.kernel_reading("d/events/rpc") is None  # conditions: Python
    assert topic_map.kernel_reading("x/T") == ("T", None, {})
    guarded = TopicMap.parse('[[topic]]\nfilter = "x/+"\nlevels = "_/type"\nwhen = {a = 1}\n'
                             '[[topic]]\nfilter = "x/+"\nlevels = "_/type"\n')
    assert guarded.kernel_reading("x/T") is None  # which rule applies depends on content
    events, _ = guarded.read(Record(1, "x/T", b'{"a": 2}', ARRIVAL_US, 1))
    assert events and events[0].type == "T"  # the second rule


def test_dead_letters_keep_text_payloads_as_text():
    from dqcep.io.payloads import Rejected, dead_letter
    letter = dead_letter(3, "t", "not json, é".encode(), 12, [Rejected("why", None)])
    assert (letter["payload"], letter["encoding"]) == ("not json, é", "utf-8")
    letter = dead_letter(3, "t", b"\xff\x00", 2, [Rejected("why", None)])
    assert (letter["payload"], letter["encoding"]) == ("/wA=", "base64")
    # text that holds what line readers split at stays one line of the dead-letter file
    from dqcep.io.sinks import json_line
    text = "a\x85b\u2028c\u2029d"
    line = json_line(dead_letter(3, "t", text.encode(), 9, [Rejected("why", None)]))
    assert len(line.decode().splitlines()) == 1
    assert json.loads(line)["payload"] == text


def test_dqcep_map_test_prints_the_events_or_the_dead_letter(tmp_path, capsys):
    from dqcep.cli import main
    (tmp_path / "shelly.toml").write_text(SHELLY)
    message = json.dumps(shelly({"temperature:0": {"id": 0, "tC": 21.5},
                                 "humidity:0": {"id": 0, "rh": 40}}))
    assert main(["map", "test", str(tmp_path / "shelly.toml"), "--topic",
                 "ht-1/events/rpc", "--payload", message]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(x["type"], x["ts"], x["device"]) for x in lines] == [
        ("Temperature", 1700000000250, "ht-1"), ("Humidity", 1700000000250, "ht-1")]
    # the service reads it the same way: the events equal the map's over the record
    events, _ = read(SHELLY, "ht-1/events/rpc", message.encode(), offset=0)
    assert lines == [e.as_mapping() for e in events]
    (tmp_path / "p.bin").write_bytes(b"not json")
    assert main(["map", "test", str(tmp_path / "shelly.toml"), "--topic", "ht-1/events/rpc",
                 "--payload-file", str(tmp_path / "p.bin"), "--arrival", "5"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    letter = json.loads(line)["dead_letter"]
    assert letter["payload"] == "not json" and "neither JSON nor msgpack" in letter["reason"]
    (tmp_path / "odd.toml").write_text('[[topic]]\nfilter = "a/+"\nlevels = "_/type"\n')
    assert main(["map", "test", str(tmp_path / "odd.toml"), "--topic", "a/T", "--payload",
                 '{"temperature:0": 1}', "--arrival", "5"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == {"id": 0, "type": "T", "ts": 5, "temperature:0": 1}
    assert "the attribute 'temperature:0' (1 event(s)) is no name a query can give" in out.err


@pytest.mark.integration
def test_dqcep_map_watch_prints_what_comes_from_the_broker(mosquitto, tmp_path):
    """Through Mosquitto: two Shelly messages and one that is no JSON (retained, so the
    watcher gets them once it has subscribed), each printed as dqcep map test prints
    it."""
    import subprocess
    import sys

    import paho.mqtt.client as mqtt

    from tests.support.paths import ROOT
    host, port = mosquitto
    (tmp_path / "shelly.toml").write_text(SHELLY)
    messages = [("ht-1/events/rpc", json.dumps(shelly({"temperature:0": {"tC": 20}}))),
                ("ht-2/events/rpc", json.dumps(shelly({"humidity:0": {"rh": 50}}))),
                ("ht-3/events/rpc", "not json")]
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.connect(host, port)
    client.loop_start()
    try:
        for topic, payload in messages:
            client.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)
    finally:
        client.loop_stop()
        client.disconnect()
    watch = subprocess.run([sys.executable, "-m", "dqcep", "map", "watch",
                            str(tmp_path / "shelly.toml"), f"mqtt://{host}:{port}/+/events/rpc",
                            "-n", "3", "--timeout", "30"], cwd=ROOT, text=True,
                           capture_output=True, timeout=60)
    assert watch.returncode == 0, watch.stderr
    lines = sorted((json.loads(x) for x in watch.stdout.splitlines()),
                   key=lambda x: x.get("device") or x["dead_letter"]["topic"])
    assert [x.get("type") or "dead" for x in lines] == ["Temperature", "Humidity", "dead"]
    assert lines[0]["device"] == "ht-1" and lines[1]["rh"] == 50
    assert lines[2]["dead_letter"]["payload"] == "not json"

