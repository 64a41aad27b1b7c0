"""Real sensor feeds as devices send them (ESPHome values, zigbee2mqtt state objects,
Tasmota nested objects, with and without payload times, no ids) for examples/sensors.cep
read with the map examples/sensors.toml: made, published, and the reference's matches
over what a journal holds (tests/service/test_feeds.py against a broker, tests/spark/test_spark.py on
the streaming job)."""
from __future__ import annotations

import json
import random
import threading
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import msgpack

from dqcep.core.events import Event
from dqcep.io.journal import read_journal
from dqcep.io.mapping import derived_id
from dqcep.lang import parse_file
from dqcep.baseline.reference import ReferenceMatcher
from tests.support.paths import ROOT

QUERIES = ROOT / "examples" / "sensors.cep"
MAP = ROOT / "examples" / "sensors.toml"
BERLIN = ZoneInfo("Europe/Berlin")


def feed(n: int, seed: int = 3):
    """``n`` messages: (topic, payload, intent) where intent is (type, attrs, ts) with
    ts None for an event timed by its arrival; payload times are taken when the
    message is made (a device with a good clock), so this is called while publishing."""
    rnd = random.Random(seed)
    for _ in range(n):
        room = rnd.choice(["r1", "r2", "r3"])
        kind = rnd.random()
        if kind < 0.45:      # ESPHome: a value object, no time, no id
            value = round(rnd.uniform(18, 30), 1)
            yield (f"sensors/{room}/Temperature", json.dumps({"value": value}).encode(),
                   ("Temperature", {"value": value, "room": room}, None))
        elif kind < 0.6:     # ESPHome: a bare value
            value = rnd.choice([0, 1])
            yield (f"sensors/{room}/Smoke", str(value).encode(),
                   ("Smoke", {"value": value, "room": room}, None))
        elif kind < 0.8:     # zigbee2mqtt: a state object, last_seen in epoch ms
            now = int(time.time() * 1000)
            state = {"temperature": round(rnd.uniform(18, 30), 1), "humidity": rnd.randint(30, 60),
                     "battery": 90, "last_seen": now}
            yield (f"zigbee2mqtt/{room}", json.dumps(state).encode(),
                   ("Climate", {"temp": state["temperature"], "humidity": state["humidity"],
                                "battery": 90, "room": room}, now))
        else:                # Tasmota: nested, a local time without an offset (whole s)
            now = datetime.now(BERLIN).replace(microsecond=0, tzinfo=None)
            temp = round(rnd.uniform(18, 30), 1) if kind < 0.97 else "n/a"  # misdeclared
            body = {"Time": now.isoformat(), "DS18B20": {"Id": "01", "Temperature": temp}}
            ts = int(now.replace(tzinfo=BERLIN).timestamp() * 1000)
            yield (f"tele/{room}/SENSOR", msgpack.packb(body) if rnd.random() < 0.3
                   else json.dumps(body).encode(),
                   None if temp == "n/a" else  # EVENT Probe(DS18B20_Temperature DOUBLE)
                   ("Probe", {"DS18B20_Id": "01", "DS18B20_Temperature": temp, "room": room},
                    ts))


class Publisher(threading.Thread):
    """Publishes the feed with QoS 1, paced, from one client (the broker keeps order),
    while ``running`` is set: a test clears it while its service is down. Messages the
    broker keeps for a service that is down arrive in one burst, all timed by arrival
    within milliseconds: the fire query's 300 ms window then holds hundreds of readings,
    10^5 matches, which the reference enumerates for a minute of CPU (publishing while a
    service is down is tests/service/test_workers.py's subject; here it is what was in flight)."""

    def __init__(self, host, port, n, pace=0.002):
        super().__init__(daemon=True)
        self.host, self.port, self.n, self.pace = host, port, n, pace
        self.sent: list[tuple[str, bytes, tuple]] = []
        self.error = None
        self.running = threading.Event()
        self.running.set()

    def run(self):
        import paho.mqtt.client as mqtt
        try:
            client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="devices")
            client.connect(self.host, self.port)
            client.loop_start()
            infos = []
            for topic, payload, intent in feed(self.n):
                if not self.running.wait(120):
                    raise TimeoutError("the publisher was held for 2 minutes")
                infos.append(client.publish(topic, payload, qos=1))
                self.sent.append((topic, payload, intent))
                time.sleep(self.pace)
            for info in infos:
                info.wait_for_publish(30)
            client.disconnect()
            client.loop_stop()
        except BaseException as err:  # noqa: BLE001 - the test reports it
            self.error = err


def expected(journal_dir: Path, sent, with_returns: bool = False) -> set[str]:
    """The reference's matches on the events the test meant to send, with the ids and
    arrival times the journal gave them: every message journaled once, in order."""
    records = list(read_journal(journal_dir, include_open=True))
    assert [(r.topic, r.payload) for r in records] == [(t, p) for t, p, _ in sent]
    events = [Event(derived_id(r.offset, 0), intent[0],
                    r.arrival_us // 1000 if intent[2] is None else intent[2], intent[1])
              for r, (_, _, intent) in zip(records, sent) if intent is not None]
    matches = ReferenceMatcher(parse_file(QUERIES).queries).run(events)
    return {json.dumps(m.to_json_obj(with_returns)) for m in matches}
