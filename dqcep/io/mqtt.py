"""MQTT endpoints on paho-mqtt 2.x (callback API version 2)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from dqcep.errors import UserError

DEFAULT_PORT = 1883


@dataclass(frozen=True)
class MqttUrl:
    host: str
    port: int
    topic: str

    @staticmethod
    def parse(url: str) -> "MqttUrl":
        """``mqtt://host[:port]/topic/with/levels``."""
        parts = urlsplit(url)
        if parts.scheme != "mqtt" or not parts.hostname:
            raise UserError(f"not an MQTT URL: {url!r} (expected mqtt://host:port/topic)")
        topic = parts.path.lstrip("/")
        if not topic:
            raise UserError(f"MQTT URL {url!r} names no topic (mqtt://host:port/topic)")
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise UserError(f"MQTT URL {url!r} has an invalid port") from None
        return MqttUrl(parts.hostname, port, topic)


class MqttPublisher:
    """Publishes payloads with QoS 1 and, on ``close()``, waits until every one is acked."""

    def __init__(self, url: MqttUrl, client_id: str = "", connect_timeout: float = 10.0,
                 max_inflight: int = 1000):
        import paho.mqtt.client as mqtt

        self.url = url
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
        self.client.max_inflight_messages_set(max_inflight)
        self._connected = threading.Event()
        self._connect_error: str | None = None
        self._pending = []
        self.published = 0

        def on_connect(client, userdata, flags, reason_code, properties):
            if reason_code.is_failure:
                self._connect_error = str(reason_code)
            self._connected.set()

        self.client.on_connect = on_connect
        try:
            self.client.connect(url.host, url.port)
        except OSError as err:
            raise UserError(f"cannot connect to the MQTT broker at {url.host}:{url.port}: "
                            f"{err.strerror or err}") from None
        self.client.loop_start()
        if not self._connected.wait(connect_timeout) or self._connect_error:
            self.client.loop_stop()
            raise UserError(f"the MQTT broker at {url.host}:{url.port} did not accept the "
                            f"connection: {self._connect_error or 'timed out'}")

    def publish(self, payload: bytes) -> None:
        info = self.client.publish(self.url.topic, payload, qos=1)
        self._pending.append(info)
        self.published += 1
        if len(self._pending) > 4096:  # keep the list short: drop what is acknowledged
            self._pending = [i for i in self._pending if not i.is_published()]

    def close(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        try:
            for info in self._pending:
                info.wait_for_publish(max(0.0, deadline - time.monotonic()))
                if not info.is_published():
                    raise UserError(f"MQTT broker at {self.url.host}:{self.url.port} did not "
                                    f"acknowledge every message within {timeout:.0f} s")
        finally:
            self.client.disconnect()
            self.client.loop_stop()
