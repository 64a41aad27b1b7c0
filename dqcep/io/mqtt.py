"""MQTT endpoints: the publisher on paho-mqtt 2.x (callback API version 2), the source on
its own socket (``dqcep.io.mqtt_wire``: one pass of a kernel per read, no per-message
Python)."""
from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np

from dqcep.core.errors import UserError

DEFAULT_PORT = 1883
REDELIVERY_WINDOW = 4096  # journal records a redelivered message is looked for among
REACH_TIMEOUT = 2.0  # s until a broker that cannot be reached is reported
READ_TIMEOUT = 0.25  # s a read waits: how soon the source sees stop, a commit to retry


TLS_PORT = 8883
PASSWORD_ENV = "DQCEP_MQTT_PASSWORD"
CA_ENV = "DQCEP_MQTT_CA"


def topic_problem(topic: str, subscribe: bool) -> str | None:
    """What makes ``topic`` no MQTT topic name (publish) or filter (subscribe), or None.

    MQTT 3.1.1 section 4.7: at least one character, no NUL, at most 65,535 bytes
    of UTF-8; ``+`` fills a whole level and ``#`` is the last level, and only a
    filter (a subscription) may hold either.
    """
    if "\0" in topic:
        return "a topic cannot hold a NUL character"
    try:
        size = len(topic.encode("utf-8"))
    except UnicodeEncodeError:
        return "a topic must be valid UTF-8"
    if size > 65_535:
        return f"a topic is at most 65,535 bytes; this one has {size:,}"
    levels = topic.split("/")
    if not subscribe:
        if "+" in topic or "#" in topic:
            return "a topic to publish to cannot hold the wildcards + or #"
        if topic.startswith("$"):  # MQTT 4.7.2
            return ("a topic starting with $ is the broker's ($SYS/...): clients do not "
                    "publish there, and no wildcard subscription (#) receives it")
        return None
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return "'#' must be a whole level and the last one (sensors/#)"
        if "+" in level and level != "+":
            return "'+' must be a whole level (sensors/+/temperature)"
    return None


@dataclass(frozen=True)
class MqttUrl:
    host: str
    port: int
    topic: str
    username: str | None = None
    tls: bool = False

    @staticmethod
    def parse(url: str, subscribe: bool = False) -> "MqttUrl":
        """``mqtt[s]://[user@]host[:port]/topic/with/levels``.

        The topic is everything after the first ``/`` that follows the host,
        taken literally: ``#``, ``+`` and ``?`` are topic characters here, not a
        URL's fragment or query, and nothing is percent-decoded. A topic to
        subscribe to (``subscribe=True``) may be an MQTT filter with ``+`` (a
        whole level) and ``#`` (the last level); a topic to publish to may not.
        The password comes from the environment (DQCEP_MQTT_PASSWORD), never
        from the URL: a command line is visible to every user of the machine.
        ``mqtts`` means TLS (default port 8883; DQCEP_MQTT_CA names a CA file).
        """
        scheme, sep, rest = url.partition("://")
        if not sep or scheme not in ("mqtt", "mqtts"):
            raise UserError(f"not an MQTT URL: {url!r} (expected mqtt://host:port/topic)")
        netloc, _, topic = rest.partition("/")
        parts = urlsplit(f"{scheme}://{netloc}")
        if not parts.hostname:
            raise UserError(f"MQTT URL {url!r} names no host (mqtt://host:port/topic)")
        if parts.password is not None:
            raise UserError(f"put no password in an MQTT URL; set {PASSWORD_ENV} instead")
        if not topic:
            raise UserError(f"MQTT URL {url!r} names no topic (mqtt://host:port/topic)")
        problem = topic_problem(topic, subscribe)
        if problem:
            raise UserError(f"MQTT URL {url!r}: {problem}")
        tls = scheme == "mqtts"
        try:
            port = parts.port or (TLS_PORT if tls else DEFAULT_PORT)
        except ValueError:
            raise UserError(f"MQTT URL {url!r} has an invalid port") from None
        return MqttUrl(parts.hostname, port, topic, parts.username, tls)

    def configure(self, client) -> None:
        """Credentials and TLS on a paho client, as this URL and the environment say."""
        import os
        if self.username:
            client.username_pw_set(self.username, os.environ.get(PASSWORD_ENV))
        if self.tls:
            client.tls_set_context(self.tls_context())

    def tls_context(self):
        """The TLS context for ``mqtts``: the CA file DQCEP_MQTT_CA names, else the
        system's CA certificates; the broker's certificate and host name are checked."""
        import os
        import ssl
        ca = os.environ.get(CA_ENV) or None
        try:
            return ssl.create_default_context(cafile=ca)
        except (OSError, ssl.SSLError, ValueError) as err:
            where = f"{CA_ENV}={ca}" if ca else "the system's CA certificates"
            reason = getattr(err, "strerror", None) or getattr(err, "reason", None) or err
            raise UserError(f"cannot use {where} for mqtts://: {reason}") from None


class MqttPublisher:
    """Publishes payloads with QoS 1 and, on ``close()``, waits until every one is acked.

    It survives a broker restart: paho keeps every unacknowledged message and
    sends it again once it has reconnected (backoff 1 to 8 s), and a message
    published while the connection is down waits in the same queue. Messages
    are counted as delivered only when their PUBACK arrives (``on_publish``), so
    ``close()`` returns only when the broker has them all; ``publish`` blocks
    while ``max_pending`` are unacknowledged, so a broker that is away costs a
    bounded amount of memory, not the whole stream.
    """

    def __init__(self, url: MqttUrl, client_id: str = "", connect_timeout: float = 10.0,
                 max_inflight: int = 1000, max_pending: int = 20_000):
        import paho.mqtt.client as mqtt

        self.url = url
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
        self.client.max_inflight_messages_set(max_inflight)
        self.client.reconnect_delay_set(1, 8)
        self.max_pending = max_pending
        self._queue_full = mqtt.MQTT_ERR_QUEUE_SIZE
        self._connected = threading.Event()
        self._connect_error: str | None = None
        self._unacked: set[int] = set()
        self._acked: set[int] = set()  # PUBACKs that came before publish() returned the mid
        self._cond = threading.Condition()
        self.published = 0

        def on_connect(client, userdata, flags, reason_code, properties):
            if reason_code.is_failure:
                self._connect_error = str(reason_code)
            self._connected.set()

        def on_publish(client, userdata, mid, reason_code, properties):
            with self._cond:
                if mid in self._unacked:
                    self._unacked.discard(mid)
                else:
                    self._acked.add(mid)
                self._cond.notify_all()

        self.client.on_connect = on_connect
        self.client.on_publish = on_publish
        url.configure(self.client)
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

    def publish(self, payload: bytes, timeout: float = 60.0, topic: str | None = None) -> None:
        """QoS 1 to the URL's topic (or ``topic``)."""
        with self._cond:  # any ack frees a place, so the wait is for one ack at most
            deadline = time.monotonic() + timeout
            while len(self._unacked) >= self.max_pending:
                if time.monotonic() > deadline:
                    raise UserError(f"MQTT broker at {self.url.host}:{self.url.port} "
                                    f"acknowledged nothing for {timeout:.0f} s; "
                                    f"{len(self._unacked)} messages are waiting")
                self._cond.wait(1.0)
        # not connected (a broker restart): paho queues it and sends it after reconnecting
        info = self.client.publish(topic or self.url.topic, payload, qos=1)
        if info.rc == self._queue_full:  # cannot happen with paho's unbounded queue
            raise UserError("the MQTT client's queue is full")
        with self._cond:
            if info.mid in self._acked:
                self._acked.discard(info.mid)
            else:
                self._unacked.add(info.mid)
        self.published += 1

    def close(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        try:
            with self._cond:
                while self._unacked and time.monotonic() < deadline:
                    self._cond.wait(min(1.0, max(0.0, deadline - time.monotonic())))
                if self._unacked:
                    raise UserError(f"MQTT broker at {self.url.host}:{self.url.port} did not "
                                    f"acknowledge {len(self._unacked)} of {self.published} "
                                    f"messages within {timeout:.0f} s")
        finally:
            self.client.disconnect()
            self.client.loop_stop()


class ArrivalTimes:
    """When each recent journal offset arrived (``time.time()``), in a ring of
    ``size`` offsets: older offsets, and those journaled before this process
    started (a replay), are unknown (NaN). ``buffer``: memory of ``nbytes(size)``
    to keep the ring in (shared memory, so that other processes read it)."""

    def __init__(self, size: int = 1 << 16, buffer=None, fresh: bool = True):
        self.size = size
        if buffer is None:
            buffer = bytearray(self.nbytes(size))
        self.offsets = np.ndarray(size, np.int64, buffer, 0)
        self.times = np.ndarray(size, np.float64, buffer, 8 * size)
        if fresh:
            self.offsets[:] = -1

    @staticmethod
    def nbytes(size: int) -> int:
        return 16 * size

    def stamp(self, offset: int, t: float) -> None:
        i = offset % self.size
        self.times[i] = t
        self.offsets[i] = offset

    def stamp_range(self, first: int, count: int, t: float) -> None:
        """Offsets ``first`` to ``first + count - 1`` arrived at ``t`` (one read's)."""
        if count > self.size:
            first, count = first + count - self.size, self.size
        i = first % self.size
        head = min(count, self.size - i)
        self.times[i:i + head] = t
        self.offsets[i:i + head] = np.arange(first, first + head)
        if count > head:
            self.times[:count - head] = t
            self.offsets[:count - head] = np.arange(first + head, first + count)

    def at(self, offsets: np.ndarray) -> np.ndarray:
        i = offsets % self.size
        return np.where(self.offsets[i] == offsets, self.times[i], np.nan)

    def of(self, offset: int) -> float:
        """When one offset arrived (NaN: unknown)."""
        i = offset % self.size
        return float(self.times[i]) if self.offsets[i] == offset else math.nan


class MqttSource:
    """Subscribes with QoS 1 in a persistent session; journals messages, acks when durable.

    One thread owns the connection: it reads the socket in large buffers, the
    ``journal_records`` kernel frames the journal records of every complete PUBLISH of a
    read (one arrival time per read, see ``dqcep.io.mqtt_wire.Intake``), the thread
    commits them (fsync) and sends their PUBACKs in one send: group commit sized by what
    arrived, so a message the broker considers delivered is on disk. After each commit
    ``committed`` is set (the service waits on it for new records) and the ``on_commit``
    hooks get the durable offset; ``arrivals`` holds the wall-clock time each journal
    offset arrived, for the service's response times. The client id is fixed and the
    session persistent (clean session off), so the broker keeps what arrives while the
    service is away; a lost connection is made again with backoff (1 to 8 s), and a
    keep-alive of ``keepalive`` s finds a broker that went silent.

    A message delivered again (its PUBACK lost in a crash or a dropped connection)
    comes with the DUP flag and the packet id it had: when the journal's last
    ``REDELIVERY_WINDOW`` records hold one with that packet id, topic and payload, it is
    acknowledged and not journaled again (``redelivered`` counts them), so events whose
    ids the journal derives (``--map``) are not taken in twice; the service also drops
    repeated event ids.

    A payload over ``max_payload`` bytes is journaled as its size only
    (``journal.Refused``) and acknowledged: the service dead-letters it in its place. A
    malformed packet closes the connection with a line on stderr; what came before it
    is journaled, nothing after it was acknowledged (the broker sends it again). A
    commit that fails (a full disk) acknowledges nothing, so the broker stops sending
    once its in-flight window is full and keeps the rest; the source says why on stderr
    and tries again every ``retry_interval`` s until the journal takes the records.
    ``write_error`` is the failure while it lasts; ``failure`` is set if the thread
    dies, and the service then stops with an error instead of stalling.
    """

    def __init__(self, urls: list[MqttUrl], journal, client_id: str = "dqcep-engine",
                 connect_timeout: float = 10.0, max_payload: int | None = None,
                 retry_interval: float = 1.0, keepalive: int = 60):
        from dqcep.io.mqtt_wire import Intake
        from dqcep.io.payloads import MAX_PAYLOAD

        hosts = {(u.host, u.port, u.username, u.tls) for u in urls}
        if len(hosts) != 1:
            raise UserError("all --input MQTT URLs must name the same broker and user")
        self.url = urls[0]
        self.host, self.port = urls[0].host, urls[0].port
        self.topics = [u.topic for u in urls]
        self.client_id = client_id
        self.journal = journal
        self.retry_interval, self.connect_timeout = retry_interval, connect_timeout
        self.keepalive = keepalive
        self.write_error: str | None = None
        self.failure: str | None = None
        self._lock = threading.Lock()
        self.committed = threading.Event()  # a commit made records durable
        self.on_commit: list = []           # called with the durable offset after each
        self.arrivals = ArrivalTimes()
        self.intake = Intake(journal, self._stamp, self._lock,
                             MAX_PAYLOAD if max_payload is None else max_payload,
                             REDELIVERY_WINDOW)
        self._remember_last_records()
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        self._sock = None
        self._retry_at = 0.0
        self._last_sent = self._last_received = time.monotonic()
        self._received_at_look, self._quiet_since = 0, self._last_received  # (ticks)
        self.ticks_written = 0
        self._framing = False  # the reader has bytes whose arrival time is taken (ticks)
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name="mqtt-source")

    def _stamp(self, first: int, count: int, t: float) -> None:
        # through the source: the service may replace ``arrivals`` (a coordinator
        # shares its own with the workers)
        self.arrivals.stamp_range(first, count, t)

    @property
    def received(self) -> int:
        return self.intake.received

    @property
    def redelivered(self) -> int:
        return self.intake.redelivered

    def _remember_last_records(self) -> None:
        """What a redelivery of the previous run's last messages is recognised by."""
        from dqcep.io.journal import Gap, Refused
        start = max(0, self.journal.durable_offset - REDELIVERY_WINDOW)
        for record in self.journal.read(start):
            payload = record.payload
            if record.mid is None or isinstance(payload, Gap):
                continue
            if isinstance(payload, Refused):
                self.intake.remember(record.mid, record.offset, record.topic, None,
                                     payload.size)
            else:
                self.intake.remember(record.mid, record.offset, record.topic, payload,
                                     len(payload))

    # ------------------------------------------------------------------ records
    def take(self, data: bytes) -> list:
        """Bytes as if read from the broker (tests, calibration): their messages are
        journaled (not committed); returns their control packets."""
        return self.intake.take(data)

    def commit(self) -> bool:
        """Commit and send the PUBACKs of what is durable; False while the journal
        cannot be written (nothing is acknowledged then)."""
        from dqcep.io.journal import JournalWriteError
        with self._lock:
            try:
                self.journal.commit()
            except JournalWriteError as err:
                if self.write_error is None:
                    print(f"dqcep: {err}; acknowledging nothing, retrying every "
                          f"{self.retry_interval:g} s", file=sys.stderr, flush=True)
                self.write_error = str(err)
                self._retry_at = time.monotonic() + self.retry_interval
                return False
            if self.write_error is not None:
                print("dqcep: the journal is written again", file=sys.stderr, flush=True)
                self.write_error = None
            acks, self.intake.acks = self.intake.acks, []
            durable = self.journal.durable_offset
        for hook in self.on_commit:
            hook(durable)
        self.committed.set()
        if acks and self._sock is not None:
            self._send(b"".join(acks))
        return True

    def journal_record(self, topic: str, payload) -> int | None:
        """A record of the service's own (a change of its query set, a tick) journaled among
        the messages and committed before this returns: its journal offset. A journal
        that cannot be written raises ``JournalWriteError`` (nothing was journaled).

        ``payload``: bytes, or a function of the time (s) that makes them, called under
        the journal's lock: a tick's time is then never ahead of a message journaled
        after it. None (nothing journaled) while bytes the reader took from the socket
        wait to be journaled: their arrival time was taken before this one."""
        with self._lock:
            if callable(payload):
                if self._framing:
                    return None
                at = time.time()
                payload = payload(at)
            else:
                at = time.time()
            offset = self.journal.append(topic, payload, int(at * 1e6))
            self.arrivals.stamp(offset, at)
            self.journal.commit()
            durable = self.journal.durable_offset
        for hook in self.on_commit:
            hook(durable)
        self.committed.set()
        return offset

    def tick_if_silent(self, every_ms: int) -> int | None:
        """Spec section 7's tick: when no message has come for ``every_ms`` ms (and again
        every ``every_ms`` while none does), a tick record with this clock's time is
        journaled (``journal_record``); its offset, or None (none due; 0: never)."""
        now = time.monotonic()
        if self.received != self._received_at_look:
            self._received_at_look, self._quiet_since = self.received, now
            return None
        if not every_ms or now - self._quiet_since < every_ms / 1000 or self.write_error:
            return None  # (while the journal cannot be written, time waits with it)
        from dqcep.io.journal import TICK_TOPIC, JournalWriteError, tick_payload
        self._quiet_since = now
        try:
            offset = self.journal_record(TICK_TOPIC, lambda at: tick_payload(at * 1000))
        except JournalWriteError:  # kept, committed with the next records
            return None
        if offset is not None:
            self.ticks_written += 1
        return offset

    # ------------------------------------------------------------------ connection
    def _connect(self, timeout: float) -> None:
        """A connection, CONNECT answered by a CONNACK that accepts it, SUBSCRIBE sent
        (the SUBACK comes among the messages). OSError: the broker cannot be reached or
        did not answer; UserError: it refused."""
        import os
        import socket

        from dqcep.io.mqtt_wire import (CONNACK, CONNACK_REFUSALS, ProtocolError,
                                        connect_packet, subscribe_packet)
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            if self.url.tls:
                sock = self.url.tls_context().wrap_socket(sock, server_hostname=self.host)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            password = os.environ.get(PASSWORD_ENV) if self.url.username else None
            sock.sendall(connect_packet(self.client_id, self.keepalive, self.url.username,
                                        password))
            self.intake.reset()
            deadline = time.monotonic() + timeout
            controls = []
            while not controls:  # (what follows the CONNACK in a read is taken as usual)
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                n = sock.recv_into(self.intake.view())
                if not n:
                    raise ConnectionError("the broker closed the connection before its CONNACK")
                try:
                    controls = self.intake.received_bytes(n, time.time())
                except ProtocolError as err:
                    raise ConnectionError(str(err)) from None
            (kind, _, body), *later = controls
            if kind != CONNACK or len(body) != 2:
                raise ConnectionError(f"the broker answered CONNECT with a packet of type {kind}")
            if body[1]:
                raise UserError(f"the MQTT broker at {self.host}:{self.port} refused the "
                                f"connection: {CONNACK_REFUSALS.get(body[1], body[1])}")
            self._answer(later)
            sock.sendall(subscribe_packet(1, self.topics))
            sock.settimeout(READ_TIMEOUT)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._last_sent = self._last_received = time.monotonic()

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
            self._last_sent = time.monotonic()
        except OSError:
            self._drop()  # the reader finds the socket gone and connects again

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None

    def _answer(self, controls) -> None:
        from dqcep.io.mqtt_wire import SUBACK, SUBACK_FAILURE
        for kind, _flags, body in controls:
            if kind == SUBACK:
                if SUBACK_FAILURE in body[2:]:
                    self.failure = (f"the MQTT broker at {self.host}:{self.port} refused "
                                    f"the subscription to {', '.join(self.topics)}")
                self._subscribed.set()
            # PINGRESP: the read itself counts; nothing else is sent to a subscriber

    def _read_once(self) -> None:
        import socket

        from dqcep.io.mqtt_wire import PINGREQ_PACKET
        try:
            n = self._sock.recv_into(self.intake.view())
        except socket.timeout:
            n = -1
        now = time.monotonic()
        if n == 0:
            raise ConnectionError("the broker closed the connection")
        if n > 0:
            self._last_received = now
            # set before the arrival time is taken: a tick waits until these bytes are
            # journaled, so that none is journaled after a later tick (journal_record)
            self._framing = True
            try:
                self._answer(self.intake.received_bytes(n, time.time()))
            finally:
                self._framing = False
        elif now - self._last_received > 1.5 * self.keepalive:
            raise ConnectionError(f"the broker said nothing for {1.5 * self.keepalive:g} s")
        if (self.write_error is None or now >= self._retry_at) and \
                (self.intake.acks or self.journal.next_offset > self.journal.durable_offset
                 or self.write_error is not None):
            self.commit()
        if self._sock is not None and (now - self._last_sent > self.keepalive / 2
                                       or now - self._last_received > self.keepalive / 2):
            self._send(PINGREQ_PACKET)

    def _read_loop(self) -> None:
        from dqcep.io.mqtt_wire import ProtocolError
        delay = 1.0
        try:
            while not self._stop.is_set():
                if self._sock is None:
                    if self.journal.next_offset > self.journal.durable_offset:
                        self.commit()  # what the last connection brought
                    try:
                        self._connect(REACH_TIMEOUT)
                        delay = 1.0
                    except (OSError, UserError) as err:
                        self._stop.wait(delay)
                        delay = min(8.0, 2 * delay)
                        if isinstance(err, UserError):
                            print(f"dqcep: {err}; trying again", file=sys.stderr, flush=True)
                    continue
                try:
                    self._read_once()
                except ProtocolError as err:
                    print(f"dqcep: {err}; closing the connection to {self.host}:{self.port} "
                          f"(what came before it is journaled; the broker sends the rest "
                          f"again)", file=sys.stderr, flush=True)
                    self._drop()
                except OSError:  # ConnectionError among them: connect again
                    self._drop()
        except BaseException as err:  # noqa: BLE001 - the service sees it and stops
            self.failure = f"receiving messages failed: {err!r}"

    def start(self) -> None:
        """Connect and subscribe. A broker that cannot be reached, or does not answer,
        is reported within REACH_TIMEOUT s with its address and the reason; one that
        answers has ``connect_timeout`` s to confirm the subscription."""
        deadline = time.monotonic() + REACH_TIMEOUT
        while True:
            try:
                self._connect(max(0.05, deadline - time.monotonic()))
                break
            except TimeoutError:
                raise UserError(f"the MQTT broker at {self.host}:{self.port} did not answer "
                                f"within {REACH_TIMEOUT:g} s") from None
            except OSError as err:
                if time.monotonic() + 0.25 > deadline:
                    raise UserError(f"cannot connect to the MQTT broker at {self.host}:"
                                    f"{self.port}: {err.strerror or err}") from None
                time.sleep(0.25)
        self._reader.start()
        if not self._subscribed.wait(self.connect_timeout) or self.failure:
            self.stop()
            raise UserError(self.failure or f"the MQTT broker at {self.host}:{self.port} did "
                            f"not confirm the subscription to {', '.join(self.topics)}")

    def stop(self) -> bool:
        """Disconnect after a last commit; False if that commit failed (nothing of it
        was acknowledged: the broker sends it again to the next session)."""
        from dqcep.io.mqtt_wire import DISCONNECT_PACKET
        self._stop.set()
        if self._reader.is_alive():
            self._reader.join()
        committed = self.commit()
        if self._sock is not None:
            self._send(DISCONNECT_PACKET)
            self._drop()
        return committed
