"""Matches published to an MQTT topic (``MqttMatchSink``), through Mosquitto."""
import json
import queue
import time

import msgpack
import pytest

from dqcep.core.events import Match
from dqcep.io.sinks import open_match_sink


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_each_match_is_one_payload_on_the_topic(mosquitto, fmt):
    import paho.mqtt.client as mqtt
    host, port = mosquitto
    got: queue.Queue = queue.Queue()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.on_message = lambda c, u, m: got.put(m.payload)
    subscribed = queue.Queue()
    client.on_subscribe = lambda *a: subscribed.put(True)
    client.connect(host, port)
    client.subscribe("alerts", qos=1)
    client.loop_start()
    try:
        subscribed.get(timeout=10)
        sink = open_match_sink(f"mqtt://{host}:{port}/alerts", fmt)
        matches = [Match("q", 5, (("x", 1),)), Match("q", 7, (("x", 2), ("y", 3)))]
        assert sink.write_matches(matches) == 2 and sink.sync() is None
        sink.close()
        decode = json.loads if fmt == "json" else msgpack.unpackb
        deadline = time.monotonic() + 10
        payloads = []
        while len(payloads) < 2 and time.monotonic() < deadline:
            payloads.append(decode(got.get(timeout=10)))
        assert payloads == [m.to_json_obj() for m in matches]
    finally:
        client.loop_stop()
        client.disconnect()
