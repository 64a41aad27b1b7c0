"""The MQTT source's connection against a scripted broker on a loopback socket: what a
real broker never sends (a malformed packet) and what takes a minute with one (a silent
connection, the keep-alive)."""
from __future__ import annotations

import socket
import struct
import threading

import pytest

from dqcep.core.errors import UserError
from dqcep.io.journal import Journal
from dqcep.io.mqtt import MqttSource, MqttUrl
from dqcep.io.mqtt_wire import (CONNECT, PINGREQ, PUBACK, SUBSCRIBE, control_packet, packet,
                                publish_packet)

CONNACK_OK = b"\x20\x02\x00\x00"


class ScriptedBroker:
    """Accepts connections one after the other; ``script(conn)`` plays each."""

    def __init__(self, *scripts):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.seen: list[list[tuple[int, bytes]]] = []  # per connection: (type, body) received
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._serve, args=(scripts,), daemon=True)
        self.thread.start()

    def _serve(self, scripts):
        try:
            for script in scripts:
                conn, _ = self.server.accept()
                conn.settimeout(10)
                self.seen.append([])
                with conn:
                    script(Conn(conn, self.seen[-1]))
        except BaseException as err:  # noqa: BLE001 - the test asserts there were none
            self.errors.append(err)


class Conn:
    def __init__(self, sock, seen):
        self.sock, self.seen, self.buf = sock, seen, b""

    def expect(self, kind: int) -> bytes:
        """The next packet the source sends, which must be of ``kind``."""
        while True:
            found = control_packet(self.buf, 0, len(self.buf)) if len(self.buf) >= 2 else None
            if found is not None:
                got, _, body, end = found
                self.buf = self.buf[end:]
                self.seen.append((got, body))
                assert got == kind, f"expected packet type {kind}, got {got}"
                return body
            data = self.sock.recv(65536)
            assert data, "the source closed the connection"
            self.buf += data

    def closed(self) -> bool:
        """True once the source closes its side (what it sent meanwhile is kept)."""
        while True:
            data = self.sock.recv(65536)
            if not data:
                return True
            self.buf += data

    def session(self):
        self.expect(CONNECT)
        self.sock.sendall(CONNACK_OK)
        mid = struct.unpack("!H", self.expect(SUBSCRIBE)[:2])[0]
        self.sock.sendall(packet(9, 0, struct.pack("!H", mid) + b"\x01"))


def source_for(broker, journal, **kw) -> MqttSource:
    url = MqttUrl.parse(f"mqtt://127.0.0.1:{broker.port}/sensors/#", subscribe=True)
    return MqttSource([url], journal, client_id="scripted", **kw)


def test_a_malformed_packet_closes_the_connection_and_loses_nothing_acknowledged(
        tmp_path, capfd):
    def first(c):
        c.session()
        c.sock.sendall(publish_packet("sensors/a", b"1", 1) + publish_packet("sensors/a", b"2", 2)
                       + b"\x36\x05\x00\x01a\x00\x03")  # QoS 3: malformed
        assert c.closed()

    def second(c):  # the broker sends again what was not acknowledged, then more
        c.session()
        c.sock.sendall(publish_packet("sensors/a", b"1", 1, dup=True)
                       + publish_packet("sensors/a", b"2", 2, dup=True)
                       + publish_packet("sensors/a", b"3", 3))
        assert [c.expect(PUBACK) for _ in range(3)] == [b"\x00\x01", b"\x00\x02", b"\x00\x03"]

    broker = ScriptedBroker(first, second)
    journal = Journal(tmp_path, fsync="never")
    source = source_for(broker, journal)
    source.start()
    broker.thread.join(20)
    source.stop()
    assert not broker.errors and not broker.thread.is_alive()
    # nothing of the first connection was acknowledged: no PUBACK came before its close
    assert [kind for kind, _ in broker.seen[0]] == [CONNECT, SUBSCRIBE]
    assert [(r.payload, r.mid) for r in journal.read()] == [(b"1", 1), (b"2", 2), (b"3", 3)]
    assert source.redelivered == 2 and source.failure is None
    err = capfd.readouterr().err
    assert "a malformed PUBLISH at byte" in err and "its QoS is 3" in err
    assert f"closing the connection to 127.0.0.1:{broker.port}" in err
    journal.close()


def test_a_quiet_connection_is_kept_alive_and_a_silent_broker_is_left(tmp_path):
    """keep-alive 2 s: a PINGREQ within a second of silence; a broker that answers
    nothing for 3 s is left and connected to again."""
    def silent(c):
        c.session()
        c.expect(PINGREQ)  # never answered
        assert c.closed()

    def answering(c):
        c.session()
        c.sock.sendall(publish_packet("sensors/b", b"x", 7))
        assert c.expect(PUBACK) == b"\x00\x07"

    broker = ScriptedBroker(silent, answering)
    journal = Journal(tmp_path, fsync="never")
    source = source_for(broker, journal, keepalive=2)
    source.start()
    broker.thread.join(30)
    source.stop()
    assert not broker.errors and not broker.thread.is_alive()
    assert [(r.payload, r.mid) for r in journal.read()] == [(b"x", 7)]
    journal.close()


def test_a_refused_subscription_is_one_line(tmp_path):
    def refusing(c):
        c.expect(CONNECT)
        c.sock.sendall(CONNACK_OK)
        mid = struct.unpack("!H", c.expect(SUBSCRIBE)[:2])[0]
        c.sock.sendall(packet(9, 0, struct.pack("!H", mid) + b"\x80"))
        c.closed()

    broker = ScriptedBroker(refusing)
    journal = Journal(tmp_path, fsync="never")
    source = source_for(broker, journal)
    with pytest.raises(UserError) as err:
        source.start()
    assert str(err.value) == (f"the MQTT broker at 127.0.0.1:{broker.port} refused the "
                              f"subscription to sensors/#")
    journal.close()
