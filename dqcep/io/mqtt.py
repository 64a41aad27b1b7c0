"""MQTT endpoints on paho-mqtt 2.x (callback API version 2)."""
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
            import ssl
            ca = os.environ.get(CA_ENV) or None
            try:
                client.tls_set(ca_certs=ca)
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

    def at(self, offsets: np.ndarray) -> np.ndarray:
        i = offsets % self.size
        return np.where(self.offsets[i] == offsets, self.times[i], np.nan)

    def of(self, offset: int) -> float:
        """When one offset arrived (NaN: unknown)."""
        i = offset % self.size
        return float(self.times[i]) if self.offsets[i] == offset else math.nan


def _fingerprint(topic: str, payload, crc32) -> tuple[str, int, int]:
    """A message's topic, size and checksum (a payload refused at ingest: its size)."""
    if isinstance(payload, (bytes, bytearray)):
        return topic, len(payload), crc32(payload)
    return topic, payload.size, -1


class MqttSource:
    """Subscribes with QoS 1 in a persistent session; journals messages, acks when durable.

    Messages are appended to the journal as they arrive; a committer thread
    commits the journal as soon as messages wait (group commit: what arrives
    during one fsync goes in the next; at most ``commit_interval`` s apart) and
    only then sends the PUBACKs, so a message the broker considers delivered is
    on disk. After each commit ``committed`` is set (the service waits on it for
    new records), and ``arrivals`` holds the wall-clock time each journal offset
    arrived, for the service's response times. The client
    id is fixed and the session persistent (clean session off), so the broker
    keeps what arrives while the service is away; paho reconnects with backoff.
    A message delivered again (its PUBACK lost in a crash or a dropped
    connection) comes with the DUP flag and the packet id it had: when the journal's
    last ``REDELIVERY_WINDOW`` records hold one with that packet id, topic and
    payload, it is acknowledged and not journaled again (``redelivered`` counts
    them), so events whose ids the journal derives (``--map``) are not taken in
    twice; the service also drops repeated event ids.

    A payload over ``max_payload`` bytes is journaled as its size only
    (``journal.Refused``) and acknowledged: the service dead-letters it in its
    place. A commit that fails (a full disk) acknowledges nothing, so the broker
    stops sending once its in-flight window is full and keeps the rest; the
    committer says why on stderr and tries again every ``retry_interval`` s
    until the journal takes the records. ``write_error`` is the failure while
    it lasts; ``failure`` is set if a callback or the committer dies, and the
    service then stops with an error instead of stalling.
    """

    def __init__(self, urls: list[MqttUrl], journal, client_id: str = "dqcep-engine",
                 commit_interval: float = 0.01, connect_timeout: float = 10.0,
                 max_payload: int | None = None, retry_interval: float = 1.0):
        import paho.mqtt.client as mqtt

        from dqcep.io.payloads import MAX_PAYLOAD

        hosts = {(u.host, u.port, u.username, u.tls) for u in urls}
        if len(hosts) != 1:
            raise UserError("all --input MQTT URLs must name the same broker and user")
        self.host, self.port = urls[0].host, urls[0].port
        self.topics = [u.topic for u in urls]
        self.journal = journal
        self.commit_interval, self.retry_interval = commit_interval, retry_interval
        self.connect_timeout = connect_timeout
        self.max_payload = MAX_PAYLOAD if max_payload is None else max_payload
        self.received = 0
        self.redelivered = 0
        # packet id -> (topic, size, crc32) of the journal's last records, oldest first
        self._recent: dict[int, tuple[str, int, int]] = self._last_records(journal)
        self.write_error: str | None = None
        self.failure: str | None = None
        self._lock = threading.Lock()
        self._pending: list[int] = []
        self._arrived = threading.Event()   # messages wait for a commit
        self.committed = threading.Event()  # a commit made records durable
        self.on_commit: list = []           # called with the durable offset after each
        self.arrivals = ArrivalTimes()
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        self._answered = threading.Event()  # the broker's CONNACK came
        self._refused: str | None = None
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                                  clean_session=False, manual_ack=True)
        self.client.connect_timeout = REACH_TIMEOUT  # a TCP connect that hangs
        urls[0].configure(self.client)
        self.client.reconnect_delay_set(1, 8)
        self.client.max_inflight_messages_set(1000)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda c, u, mid, rc, p: self._subscribed.set()
        self.client.on_message = self._on_message
        self._committer = threading.Thread(target=self._commit_loop, daemon=True,
                                           name="journal-committer")

    @staticmethod
    def _last_records(journal) -> dict[int, tuple[str, int, int]]:
        """What a redelivery of the previous run's last messages is recognised by."""
        import zlib

        from dqcep.io.journal import Gap
        recent: dict[int, tuple[str, int, int]] = {}
        start = max(0, journal.durable_offset - REDELIVERY_WINDOW)
        for record in journal.read(start):
            payload = record.payload
            if record.mid is None or isinstance(payload, Gap):
                continue
            recent.pop(record.mid, None)
            recent[record.mid] = _fingerprint(record.topic, payload, zlib.crc32)
        return recent

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        self._answered.set()
        if reason_code.is_failure:
            self._refused = str(reason_code)
            self._subscribed.set()  # wake start() up: it reports the refusal
        else:
            client.subscribe([(t, 1) for t in self.topics])

    def _on_message(self, client, userdata, msg):
        import zlib

        from dqcep.io.journal import Refused
        try:
            try:
                topic = msg.topic
            except UnicodeDecodeError:  # a broker should refuse such a topic; keep the payload
                topic = "<topic not UTF-8>"
            payload = msg.payload
            if len(payload) > self.max_payload:
                payload = Refused(len(payload))
            seen = _fingerprint(topic, payload, zlib.crc32)
            with self._lock:
                self.received += 1
                self._pending.append(msg.mid)
                if msg.dup and self._recent.get(msg.mid) == seen:
                    self.redelivered += 1  # journaled already: acknowledged after the commit
                else:
                    now = time.time()  # the arrival time, taken once: journaled with it
                    offset = self.journal.append(topic, payload, int(now * 1e6), msg.mid)
                    self.arrivals.stamp(offset, now)
                    self._recent.pop(msg.mid, None)
                    self._recent[msg.mid] = seen
                    if len(self._recent) > REDELIVERY_WINDOW:
                        del self._recent[next(iter(self._recent))]
            self._arrived.set()
        except BaseException as err:  # noqa: BLE001 - the service sees it and stops
            self.failure = f"receiving a message failed: {err!r}"

    def _commit(self) -> bool:
        """Commit and acknowledge; False while the journal cannot be written."""
        from dqcep.io.journal import JournalWriteError
        with self._lock:
            if not self._pending and self.write_error is None:
                return True
            try:
                self.journal.commit()
            except JournalWriteError as err:
                if self.write_error is None:
                    print(f"dqcep: {err}; acknowledging nothing, retrying every "
                          f"{self.retry_interval:g} s", file=sys.stderr, flush=True)
                self.write_error = str(err)
                return False
            if self.write_error is not None:
                print("dqcep: the journal is written again", file=sys.stderr, flush=True)
                self.write_error = None
            mids, self._pending = self._pending, []
        for hook in self.on_commit:
            hook(self.journal.durable_offset)
        self.committed.set()
        for mid in mids:
            self.client.ack(mid, 1)
        return True

    def journal_record(self, topic: str, payload: bytes) -> int:
        """A record of the service's own (a change of its query set) journaled among
        the messages and committed before this returns: its journal offset. A journal
        that cannot be written raises ``JournalWriteError`` (nothing was journaled)."""
        with self._lock:
            offset = self.journal.append(topic, payload, int(time.time() * 1e6))
            self.arrivals.stamp(offset, time.time())
            self.journal.commit()
        for hook in self.on_commit:
            hook(self.journal.durable_offset)
        self.committed.set()
        return offset

    def _commit_loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._arrived.wait(self.commit_interval)
                self._arrived.clear()
                if not self._commit():
                    self._stop.wait(self.retry_interval)
        except BaseException as err:  # noqa: BLE001 - the service sees it and stops
            self.failure = f"the journal committer failed: {err!r}"

    def start(self) -> None:
        """Connect and subscribe. A broker that cannot be reached, or does not answer,
        is reported within REACH_TIMEOUT s with its address and the reason; one that
        answers has ``connect_timeout`` s to confirm the subscription."""
        deadline = time.monotonic() + REACH_TIMEOUT
        while True:
            try:
                self.client.connect(self.host, self.port)
                break
            except OSError as err:
                if time.monotonic() + 0.25 > deadline:
                    raise UserError(f"cannot connect to the MQTT broker at {self.host}:"
                                    f"{self.port}: {err.strerror or err}") from None
                time.sleep(0.25)
        self.client.loop_start()
        self.start_committer()
        if not self._answered.wait(max(0.0, deadline - time.monotonic())):
            self.stop()
            raise UserError(f"the MQTT broker at {self.host}:{self.port} did not answer "
                            f"within {REACH_TIMEOUT:g} s")
        if not self._subscribed.wait(self.connect_timeout) or self._refused:
            self.stop()
            if self._refused:
                raise UserError(f"the MQTT broker at {self.host}:{self.port} refused the "
                                f"connection: {self._refused}")
            raise UserError(f"the MQTT broker at {self.host}:{self.port} did not confirm "
                            f"the subscription to {', '.join(self.topics)}")

    def start_committer(self) -> None:
        """The committer thread alone (``start`` starts it; calibration uses it without
        a broker)."""
        self._committer.start()

    def stop_committer(self) -> bool:
        """The committer stopped after a last commit; False if that commit failed."""
        self._stop.set()
        if self._committer.is_alive():
            self._committer.join()
        return self._commit()

    def stop(self) -> bool:
        """Disconnect after a last commit; False if that commit failed (nothing of it
        was acknowledged: the broker sends it again to the next session)."""
        committed = self.stop_committer()
        self.client.disconnect()
        self.client.loop_stop()
        return committed
