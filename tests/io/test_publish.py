"""Events -> MQTT messages as devices send them (dqcep/io/publish.py)."""
import json
import time

import msgpack
import pytest

from dqcep.core.errors import UserError
from dqcep.core.events import Event
from dqcep.io import publish
from dqcep.io.publish import Pacer, PayloadShape, TopicTemplate

EVENT = Event(7, "Temperature", 1_795_687_200_500, {"room": "r1", "value": 23.5, "ok": True})


def test_rate_paces_by_sleeping(monkeypatch):
    clock = [100.0]
    slept = []
    monkeypatch.setattr(publish.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(publish.time, "sleep", lambda s: (slept.append(s),
                                                          clock.__setitem__(0, clock[0] + s)))
    pacer = Pacer(1000.0)
    pacer.wait(500)                  # the first go at once (connecting is no debt)
    assert slept == []
    pacer.wait(500)                  # 500 sent at 1000/s: the next half a second later
    assert slept == [pytest.approx(0.5)]
    clock[0] += 2.0                  # the sink was slow: no sleep needed
    pacer.wait(500)
    assert len(slept) == 1
    Pacer(None).wait(10**9)          # no rate: never sleeps
    assert len(slept) == 1


def test_topic_templates_fill_levels_from_the_event():
    t = TopicTemplate("sensors/{room}/{type}")
    assert t.topic(EVENT, "e") == "sensors/r1/Temperature" and t.fields == ["room", "type"]
    assert TopicTemplate("x/{ok}/{id}").topic(EVENT, "e") == "x/true/7"
    site = Event(1, "T", 0, {"device": "site1/room2/t-1"})
    assert TopicTemplate("s/{device}").topic(site, "e") == "s/site1/room2/t-1"
    with pytest.raises(UserError, match="events.jsonl:3: the event \\(id 7\\) has no 'site'"):
        TopicTemplate("s/{site}").topic(EVENT, "events.jsonl:3")
    for bad in ("s/{room", "s/{room:>3}", "s/{0}", "s/+/{room}"):
        with pytest.raises(UserError, match="topic template"):
            TopicTemplate(bad)


def test_payload_shapes():
    omit = ("room",)
    assert json.loads(PayloadShape("event").payload(EVENT, "e")) == EVENT.as_mapping()
    assert json.loads(PayloadShape("object", omit=omit).payload(EVENT, "e")) == {
        "value": 23.5, "ok": True}
    assert json.loads(PayloadShape("object", time_field="t", time_unit="s", omit=omit)
                      .payload(EVENT, "e")) == {"value": 23.5, "ok": True,
                                                "t": 1_795_687_200.5}
    assert msgpack.unpackb(PayloadShape("object", "msgpack", omit=omit).payload(EVENT, "e")) \
        == {"value": 23.5, "ok": True}
    assert PayloadShape("value").payload(EVENT, "e") == b"23.5"
    assert PayloadShape("value", value_attr="room").payload(EVENT, "e") == b"r1"
    with pytest.raises(UserError, match="has no 'level' for a value payload"):
        PayloadShape("value", value_attr="level").payload(EVENT, "e")
    with pytest.raises(UserError, match="--time puts the event's time into an object"):
        PayloadShape("value", time_field="t")


def test_publish_refuses_what_no_broker_takes_before_it_sends_anything(mosquitto, tmp_path):
    """Issue 49 item 18: a topic over 65,535 bytes was a traceback; a $SYS/... topic was
    sent with exit 0 (no # subscriber receives it); the lines before a bad line were
    sent already. Each is refused with its place, exit 2, nothing published."""
    import subprocess
    import sys
    from tests.support.broker import subscribed
    host, port = mosquitto
    lines = [{"id": i, "type": "T", "ts": i, "room": f"r{i}"} for i in range(1, 4)]
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(e) + "\n" for e in lines))
    long_ = tmp_path / "long.jsonl"
    long_.write_text("".join(json.dumps(e) + "\n" for e in
                             lines[:2] + [{**lines[2], "room": "x" * 70_000}]))
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text("".join(json.dumps(e) + "\n" for e in lines[:2]) + "{\n")
    cases = [(long_, "t/{room}", "long.jsonl:3:1: the event's topic", "at most 65,535 bytes"),
             (good, "$SYS/{room}", "MQTT URL", "the broker's"),
             (good, "{room}", None, None),
             (bad_line, "t/{room}", "bad.jsonl:3", "invalid JSON")]
    with subscribed(host, port, "#", "publish-watch") as received:
        for path, template, where, what in cases:
            if where is None:  # a value at the start that makes it a $ topic
                path = tmp_path / "dollar.jsonl"
                path.write_text(json.dumps({**lines[0], "room": "$SYS"}) + "\n")
                where, what = "dollar.jsonl:1:1", "the broker's"
            r = subprocess.run([sys.executable, "-m", "dqcep", "publish", str(path),
                                f"mqtt://{host}:{port}/{template}", "--quiet"],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 2 and where in r.stderr and what in r.stderr, r.stderr
            assert "Traceback" not in r.stderr
        time.sleep(1)
    assert received == [], received
