"""Where matches go: a JSON-lines file or stdout, an MQTT topic (QoS 1), a webhook (an
HTTP POST per match), or a database table (``dqcep.io.database``: ``sqlite:///FILE.db``,
one transaction per batch).

File sinks can be cut back to a checkpointed length (``sync`` returns it), which
makes the streaming service's output exactly once. An MQTT topic cannot be cut
back: across a crash of the service, matches found after its last checkpoint
are published again (at least once); every match is one payload, so a consumer
can drop repeats by (query, events). A webhook likewise, each request carrying the
match's key (``match_key``).
"""
from __future__ import annotations

import json
import os
import stat
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

import msgpack
import numpy as np

from dqcep.core.errors import UserError
from dqcep.core.events import Match
from dqcep.io.match_text import LINES_BUFFER, match_key, match_lines, write_match_lines

MATCH_FORMATS = ("json", "msgpack")


# Characters JSON leaves unescaped that many line readers take for a line's end (Python's
# str.splitlines, JavaScript before ES2019): escaped, so one line stays one line
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def json_line(obj) -> bytes:
    """``obj`` as one line of UTF-8 JSON, whatever strings it holds.

    A lone surrogate (no Unicode scalar value, so no UTF-8) can only sit inside a
    JSON string here; written as ``\\udXXX`` it is the same JSON escape that
    brought it in, so the line stays valid JSON and a sink never fails on text.
    U+0085, U+2028 and U+2029 (text payloads of dead letters hold any character)
    are written as their escapes: JSON allows them raw, but line readers split there.
    """
    text = json.dumps(obj, ensure_ascii=False)
    return (text.translate(_LINE_BREAKS) + "\n").encode("utf-8", "backslashreplace")


def create_file(path: str | Path, what: str = ""):
    """A new file to write (binary), its directory made if missing: every command's
    output files are opened here. ``what`` names the content in the error."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, "wb")
    except OSError as err:
        raise UserError(f"cannot write {what + ' to ' if what else ''}{path}: "
                        f"{err.strerror}") from None


def open_file(path: str | Path, keep: int | None):
    """A file to append to, cut back to ``keep`` bytes first (None: keep all).

    A file shorter than ``keep`` was cut or replaced by someone else: refused,
    never padded (extending it would write NUL bytes where lines were).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        f = open(path, "ab")
    except OSError as err:
        raise UserError(f"cannot write {path}: {err.strerror}") from None
    if keep is not None:
        size = f.seek(0, os.SEEK_END)
        if size < keep and f.seekable() and path.is_file():
            f.close()
            raise UserError(f"{path} holds {size} bytes, but the checkpoint says {keep} were "
                            "written: it was cut or replaced outside dqcep; put it back, or "
                            "delete the checkpoint to rebuild every output from the journal")
        if path.is_file():
            f.truncate(keep)
        f.seek(0, os.SEEK_END)
    return f


@contextmanager
def naming(path: Path | None):
    """An OSError of a write to ``path`` (a full disk) names the file (a buffered
    write's error does not); ``path`` None (stdout) leaves it as it is."""
    try:
        yield
    except OSError as err:
        if err.filename or path is None:
            raise
        raise OSError(err.errno, err.strerror, str(path)) from None


def durable(f) -> None:
    """fsync a regular file; other files (/dev/null, a pipe) have nothing to make durable
    and refuse fsync."""
    if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        os.fsync(f.fileno())


def is_mqtt(target: str | None) -> bool:
    return bool(target) and target.startswith(("mqtt://", "mqtts://"))


def is_webhook(target: str | None) -> bool:
    return bool(target) and target.startswith(("https://", "http://"))


def is_remote(target: str | None) -> bool:
    """An output that cannot be cut back to a checkpoint (an MQTT topic, a webhook): the
    matches found after the last checkpoint are sent again after a crash (at least
    once, each with its match key), and every worker shares it."""
    return is_mqtt(target) or is_webhook(target)


class RemoteMatchSink:
    """An output that takes matches one at a time and cannot be cut back (an MQTT
    topic, a webhook: ``is_remote``); subclasses ``write`` one match."""

    def write(self, m: Match) -> None:
        raise NotImplementedError

    def write_matches(self, matches: list[Match]) -> int:
        for m in matches:
            self.write(m)
        return len(matches)

    def write_batch(self, batch) -> int:
        return self.write_matches(batch.to_matches())

    def sync(self) -> None:
        return None  # nothing to cut back: see the module docstring


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
WEBHOOK_TIMEOUT = 10.0      # s a request may take before it is tried again
WEBHOOK_BACKOFF = (0.25, 30.0)  # s before the first retry, and at most between two
# answers that say this match will never be taken (retrying cannot help): counted and
# said, the match left out; every other failure (no connection, 408, 429, 5xx, 401,
# 403: an endpoint down or a token being fixed) is retried until it is taken
WEBHOOK_REFUSED = (400, 404, 405, 410, 413, 415, 422)


class WebhookMatchSink(RemoteMatchSink):
    """POST each match to an HTTP endpoint as its JSON object (the spec's, with RETURN
    values under ``--returns``) plus its ``key`` (``match_key``), at least once: the
    key also goes in the ``Idempotency-Key`` header, so the endpoint can drop repeats
    (after a crash, the matches since the last checkpoint are sent again). A failed
    request is retried with exponential backoff until the endpoint takes it; the
    service's matching waits meanwhile (nothing is lost: the journal keeps taking
    messages). ``https://``, or ``http://`` on loopback only (an alert in clear text
    across a network is refused); a bearer token from ``token_file``."""

    def __init__(self, target: str, with_returns: bool = False, token_file: str | None = None,
                 say=None):
        from urllib.parse import urlsplit
        parts = urlsplit(target)
        if parts.scheme == "http" and parts.hostname not in LOOPBACK:
            raise UserError(f"--output {target}: a webhook over plain http:// only on "
                            "loopback (127.0.0.1, localhost, ::1); use https://")
        if not parts.hostname:
            raise UserError(f"--output {target}: no host in the webhook URL")
        self.url, self.with_returns = parts, with_returns
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.headers = {"Content-Type": "application/json", "User-Agent": "dqcep"}
        if token_file is not None:
            try:
                token = Path(token_file).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as err:
                raise UserError(f"cannot read the webhook token file {token_file}: "
                                f"{getattr(err, 'strerror', None) or err}") from None
            if not token or "\n" in token:
                raise UserError(f"the webhook token file {token_file} must hold one line")
            self.headers["Authorization"] = f"Bearer {token}"
        self.say = say or (lambda line: print(f"dqcep: {line}", file=sys.stderr, flush=True))
        self.conn = None
        self.sent = self.retries = self.refused = 0
        self.failing = False  # a failure said, its recovery not yet

    def _connection(self):
        import http.client
        if self.conn is None:
            port = self.url.port
            if self.url.scheme == "https":
                self.conn = http.client.HTTPSConnection(self.url.hostname, port,
                                                        timeout=WEBHOOK_TIMEOUT)
            else:
                self.conn = http.client.HTTPConnection(self.url.hostname, port,
                                                       timeout=WEBHOOK_TIMEOUT)
        return self.conn

    def _post(self, body: bytes, key: str) -> int | str:
        """One request: its status, or why there was none."""
        import http.client
        try:
            conn = self._connection()
            conn.request("POST", self.path, body, {**self.headers, "Idempotency-Key": key})
            response = conn.getresponse()
            response.read()
            if response.getheader("Connection", "").lower() == "close":
                self._drop()
            return response.status
        except (OSError, http.client.HTTPException) as err:
            self._drop()
            return str(err) or type(err).__name__

    def _drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def write(self, m: Match) -> None:
        obj = m.to_json_obj(self.with_returns)
        obj["key"] = key = match_key(m.query, obj["events"])
        body = json_line(obj)[:-1]
        wait = WEBHOOK_BACKOFF[0]
        while True:
            status = self._post(body, key)
            if isinstance(status, int) and 200 <= status < 300:
                self.sent += 1
                if self.failing:
                    self.say(f"webhook {self.url.geturl()}: taken again")
                    self.failing = False
                return
            if isinstance(status, int) and status in WEBHOOK_REFUSED:
                self.refused += 1
                self.say(f"webhook {self.url.geturl()}: HTTP {status} for match {key} of "
                         f"{m.query}: refused, left out (an answer a retry cannot change)")
                return
            if not self.failing:
                why = f"HTTP {status}" if isinstance(status, int) else status
                self.say(f"webhook {self.url.geturl()}: {why}; retrying every "
                         f"{WEBHOOK_BACKOFF[0]:g}-{WEBHOOK_BACKOFF[1]:g} s until it is taken")
                self.failing = True
            self.retries += 1
            time.sleep(wait)
            wait = min(wait * 2, WEBHOOK_BACKOFF[1])

    def close(self) -> None:
        self._drop()


class FileMatchSink:
    def __init__(self, target: str | None, keep: int | None = None,
                 with_returns: bool = False):
        self.with_returns = with_returns
        # The service's output (kept up to a checkpoint's size) must be on disk before a
        # checkpoint says so; a run from a file writes its output anew and can be run
        # again, so its close is a plain one (the fsync of 219 MB of matches took 88 ms
        # of a 1.3 s run under cProfile).
        self.sync_on_close = keep is not None
        self._lines = None  # the buffer matches are formatted into (write_batch)
        self._fd: int | None = None  # ... and the descriptor they are written to
        if target in (None, "-"):
            self.f, self.path = sys.stdout.buffer, None
            return
        self.path = Path(target)
        if keep is None:
            self.f = create_file(self.path, "matches")
        else:
            self.f = open_file(self.path, keep)

    def write(self, m: Match) -> None:
        with naming(self.path):
            self.f.write(json_line(m.to_json_obj(self.with_returns)))

    def write_matches(self, matches: list[Match]) -> int:
        """Matches with their RETURN values (``--returns``), in order."""
        for m in matches:
            self.write(m)
        return len(matches)

    def write_batch(self, batch) -> int:
        """Write every match of a MatchBatch (RETURN values need ``write``); returns how many."""
        if self.with_returns:
            raise ValueError("a sink with RETURN values writes Match objects one by one")
        with naming(self.path):
            if self._lines is None:
                self._lines = np.empty(LINES_BUFFER, np.uint8)
                try:
                    self._fd = self.f.fileno()
                except (OSError, ValueError):  # a stream without one (captured stdout)
                    self._fd = None
            if self._fd is None:
                self.f.write(match_lines(batch))
            else:
                self.f.flush()  # what went through the file object first (the kernel
                write_match_lines(batch, self._fd, self._lines)  # writes to its fd)
        return len(batch)

    def sync(self) -> int | None:
        with naming(self.path):
            self.f.flush()
            if self.path is None:
                return None
            durable(self.f)
            return self.f.tell()

    def close(self) -> None:
        if self.sync_on_close:
            self.sync()
        with naming(self.path):
            if self.path is None:
                self.f.flush()
            else:
                self.f.close()


class MqttMatchSink(RemoteMatchSink):
    """One payload per match (the spec's JSON object, or the same as msgpack), QoS 1."""

    def __init__(self, target: str, fmt: str = "json", with_returns: bool = False):
        from dqcep.io.mqtt import MqttPublisher, MqttUrl
        if fmt not in MATCH_FORMATS:
            raise UserError(f"match format must be one of {', '.join(MATCH_FORMATS)}")
        self.fmt, self.with_returns = fmt, with_returns
        self.publisher = MqttPublisher(MqttUrl.parse(target))

    def write(self, m: Match) -> None:
        obj = m.to_json_obj(self.with_returns)
        self.publisher.publish(json_line(obj)[:-1] if self.fmt == "json" else msgpack.packb(obj))

    def close(self) -> None:
        self.publisher.close()


class _Synced:
    """A point in a BackgroundSink's queue where the writer syncs (``synced``)."""

    def __init__(self, then: Callable[[int | None], object]):
        self.then, self.future = then, Future()

    def run(self, owner: "BackgroundSink") -> None:
        if owner.failure is not None:  # what it would record was not written
            self.future.set_exception(owner.failure)
            return
        try:
            self.future.set_result(self.then(owner.sink.sync()))
        except BaseException as err:
            self.future.set_exception(err)
            raise


def open_match_sink(target: str | None, fmt: str = "json", keep: int | None = None,
                    with_returns: bool = False, token_file: str | None = None):
    """A file or stdout, an MQTT topic, a webhook (``token_file``: its bearer token), or
    a database table (``dqcep.io.database``)."""
    from dqcep.io.database import is_database, open_database_sink
    if is_mqtt(target):
        return MqttMatchSink(target, fmt, with_returns)
    if is_webhook(target):
        return WebhookMatchSink(target, with_returns, token_file)
    if is_database(target):
        return open_database_sink(target, with_returns)
    return FileMatchSink(target, keep, with_returns)


class BackgroundSink:
    """A sink whose batches are formatted and written by a thread of their own, so the
    output of one batch overlaps the matching of the next (the formatting kernel and
    file writes release the GIL). At most ``depth`` batches wait; a failed write is
    raised by the next ``write_batch``, ``sync``, ``synced`` or ``close``; ``sync``
    waits for every batch given so far (a checkpoint records what is on disk);
    ``synced`` has the writer thread sync at this point while the caller goes on (an
    asynchronous checkpoint)."""

    def __init__(self, sink, depth: int = 4):
        import queue
        import threading
        self.sink, self.failure = sink, None
        self.given = self.written = 0  # matches given, and written by the thread
        self.queue: queue.Queue = queue.Queue(depth)
        self.thread = threading.Thread(target=self._run, name="match-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is None:
                    return
                if isinstance(item, _Synced):
                    item.run(self)
                elif self.failure is None:
                    self.written += self.sink.write_batch(*item) or 0
            except BaseException as err:  # handed to the caller's thread
                self.failure = err
            finally:
                self.queue.task_done()

    def _raise(self) -> None:
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure

    def write_batch(self, batch, *args) -> int:
        """The batch (and what else the sink's write_batch takes), written in order."""
        self._raise()
        if len(batch):
            self.given += len(batch)
            self.queue.put((batch, *args))
        return len(batch)

    @property
    def backlog(self) -> int:
        """Matches given and not yet written (the stats' ``output_backlog``)."""
        return self.given - self.written

    def drain(self) -> None:
        """Every batch given so far handed to the sink (written, not synced)."""
        self.queue.join()
        self._raise()

    def sync(self) -> int | None:
        """Every batch given so far written, then the sink's own sync (its length)."""
        self.drain()
        return self.sink.sync()

    def synced(self, then: Callable[[int | None], object]) -> Future:
        """``then(length)`` called by the writer thread once every batch given so far is
        written and the sink synced (``length``: what ``sync`` returns), while the
        caller goes on giving batches; the future holds what ``then`` returns. A
        failure (an earlier write's, the sync's or ``then``'s) fails the future and is
        raised by the next call, as a write's."""
        self._raise()
        done = _Synced(then)
        self.queue.put(done)
        return done.future

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        try:
            self._raise()
        finally:
            self.sink.close()

