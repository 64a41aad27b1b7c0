"""The service's HTTP side (``--http HOST:PORT``): what an operator sees of it.

    GET /          a live page (``dqcep/service/page.html``: throughput and lag over
                   the last minutes, matches and response times per query, dead
                   letters and late events by reason, the last matches, the plan)
    GET /status    the stats JSON (what ``--stats-file`` holds) and the query set
    GET /queries   the query set alone
    GET /metrics   the same figures in Prometheus's exposition format
    GET /plan.svg  the shared DAG as ``dqcep explain --dot`` draws it (Graphviz)
    GET /plan.dot  the same DAG as DOT text
    POST /queries, DELETE /queries/NAME
                   live changes of the query set (``changes``: with the token)

The server is waitress (a maintained, pure-Python WSGI server with a thread pool) in
a thread of its own. It never reads the engine: the engine belongs to the service's
thread, which publishes a snapshot of its figures to the ``Board`` every
``PUBLISH_EVERY`` seconds; every request answers from the newest snapshot, so
``/status`` and ``/metrics`` of one snapshot agree exactly, and a scrape costs the
service nothing but that snapshot.

Access: a bind to a non-loopback address needs ``--http-token-file`` (every request
then carries ``Authorization: Bearer TOKEN``); on loopback the read-only endpoints
are open and only a change (``POST``/``DELETE``) needs the token. Every request must
name the service in its ``Host`` header (an IP address, ``localhost``, this machine's
name or one given by ``--http-host``): a page of another origin that a DNS name
rebound to this address names its own, and is refused (421).

A request's headers are read before its body: a body without the token, to a host
that is not the service's, or over ``MAX_BODY`` is refused without being read (it is
never spooled to disk), and a request whose headers and body are not in within
``REQUEST_SECONDS`` is cut off, so slow connections cannot hold the server.
"""
from __future__ import annotations

import functools
import hmac
import ipaddress
import json
import math
import os
import re
import shutil
import socket
import stat
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from importlib import resources

from dqcep.core.errors import UserError

PUBLISH_EVERY = 0.5     # s between the service's snapshots for the HTTP side
HISTORY_SECONDS = 600   # how far back the page's charts reach
LAST_MATCHES = 20       # matches the page lists
MAX_BODY = 1 << 20      # bytes of a change's body (a query file's text), at most
DEFAULT_HOST = "127.0.0.1"
REQUEST_SECONDS = 10    # a request's headers and body are in within this, or it is cut off
CONNECTIONS = 400       # open connections at most (waitress's connection_limit)
PLAN_WAIT = 2.0         # s a request for /plan.svg waits for a drawing under way
PLAN_DRAW_SECONDS = 30  # a drawing that takes longer is given up (and not tried again)
# RFC 6750's b64token: what a bearer token may be made of
TOKEN_CHARS = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


# ------------------------------------------------------------------- options

@dataclass(frozen=True)
class HttpAccess:
    """Where the HTTP side listens and the token a request must carry (None: no
    token; then only loopback is allowed and nothing can be changed)."""

    host: str
    port: int
    token: str | None = None
    names: tuple[str, ...] = ()  # host names of the service's besides its addresses

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def own_host(self, header: str | None) -> bool:
        """Whether a request's ``Host`` names this service: an IP address (a page that
        rebinds a DNS name to it sends that name), ``localhost``, this machine's name,
        or one of ``names``; any port."""
        if not header:
            return False
        host = header.strip().lower()
        if host.startswith("["):
            host = host[1:host.find("]")] if "]" in host else ""
        elif host.count(":") == 1:
            host = host.split(":")[0]
        try:
            ipaddress.ip_address(host)
            return True
        except ValueError:
            pass
        return host.rstrip(".") in self._own_names()

    def _own_names(self) -> set[str]:
        return {"localhost", *_machine_names(), *(n.lower() for n in self.names)}


@functools.lru_cache(maxsize=1)
def _machine_names() -> frozenset[str]:
    """This machine's names, looked up once (getfqdn may ask DNS: not per request)."""
    return frozenset(n.lower() for n in (socket.gethostname(), socket.getfqdn()) if n)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_bind(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT``, ``:PORT`` or ``PORT`` (host: loopback) -> (host, port)."""
    host, port = DEFAULT_HOST, text
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1:close + 2] != ":":
            raise UserError(f"--http {text}: give HOST:PORT ([::1]:PORT for IPv6)")
        host, port = text[1:close], text[close + 2:]
    elif ":" in text:
        host, port = text.rsplit(":", 1)
        host = host or DEFAULT_HOST
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise UserError(f"--http {text}: the port must be a number from 0 to 65535 "
                        "(0: any free port, said at start)")
    return host, number


TOKEN_RECIPE = ("python3 -c 'import secrets; print(secrets.token_urlsafe())' > token && "
                "chmod 600 token")


def read_token(path: str, option: str, private: bool = True) -> str:
    """The token a file holds (its text without surrounding whitespace): one line of
    RFC 6750's token characters, at least 16 of them, in a file only its owner may
    read (``private``: the service's; a client only reads it)."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            raw = f.read()
    except OSError as err:
        raise UserError(f"cannot read {option} {path}: {err.strerror}") from None
    if private and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UserError(f"{option} {path}: the file may be read by others (mode "
                        f"{stat.S_IMODE(mode):o}); chmod 600 {path}, or make it with "
                        f"{TOKEN_RECIPE}")
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise UserError(f"{option} {path}: the token must be ASCII text (letters, digits "
                        "and -._~+/), e.g. " + TOKEN_RECIPE) from None
    if not TOKEN_CHARS.fullmatch(token):
        raise UserError(f"{option} {path}: the token must be one line of letters, digits "
                        "and -._~+/ (no spaces or line breaks inside), e.g. " + TOKEN_RECIPE)
    if len(token) < 16:
        raise UserError(f"{option} {path}: the token must be at least 16 characters "
                        "(e.g. " + TOKEN_RECIPE + ")")
    return token


def http_access(bind: str, token_file: str | None, names=()) -> HttpAccess:
    """The ``--http``, ``--http-token-file`` and ``--http-host`` options, checked."""
    host, port = parse_bind(bind)
    token = None
    if token_file is not None:
        token = read_token(token_file, "--http-token-file")
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", name):
            raise UserError(f"--http-host {name!r}: give a host name (letters, digits, "
                            "dots and dashes)")
    if token is None and not is_loopback(host):
        raise UserError(f"--http {bind}: a non-loopback address needs --http-token-file "
                        "(anyone who reaches it could read the service and change its "
                        "queries); bind 127.0.0.1 to go without one")
    return HttpAccess(host, port, token, tuple(names))


# ------------------------------------------------------------------- the board

class Board:
    """The newest snapshot of the service's figures, the history of a few of them
    over the last ``HISTORY_SECONDS``, and the plan: written by the service's thread,
    read by the HTTP threads."""

    def __init__(self, plan_dot: str):
        self.plan_dot = plan_dot
        self._lock = threading.Lock()
        self._status: dict = {}
        self._history: deque = deque()
        self._svg: bytes | None = None
        self._svg_why: str | None = None
        self._svg_for: str | None = None
        self._drawn = threading.Event()

    def publish(self, status: dict) -> None:
        now = time.time()
        status = {**status, "time": now}
        with self._lock:
            self._history.append((round(now, 3), status.get("events_in", 0),
                                  status.get("matches_out", 0),
                                  status.get("lag_records", 0)))
            while self._history and self._history[0][0] < now - HISTORY_SECONDS:
                self._history.popleft()
            status["history"] = {"columns": ["time", "events_in", "matches_out",
                                             "lag_records"],
                                 "rows": list(self._history)}
            self._status = status

    def set_plan(self, plan_dot: str) -> None:
        with self._lock:
            self.plan_dot = plan_dot

    def status(self) -> dict:
        with self._lock:
            return self._status

    def plan_svg(self) -> tuple[bytes | None, str | None]:
        """(the plan drawn by Graphviz's ``dot``, None) once drawn; (None, why) where
        it is not installed, the drawing failed or took over ``PLAN_DRAW_SECONDS`` (not
        tried again for that plan), or is still under way after ``PLAN_WAIT`` s. One
        drawing at a time, in a thread of its own: requests never hold the server's
        threads for longer than that wait."""
        with self._lock:
            dot = self.plan_dot
            if self._svg_for != dot:
                if not shutil.which("dot"):
                    return None, "the plan is drawn by Graphviz's dot, which is not " \
                        "installed here; /plan.dot has it as DOT"
                self._svg_for, self._svg, self._svg_why = dot, None, None
                self._drawn = threading.Event()
                threading.Thread(target=self._draw, args=(dot, self._drawn),
                                 name="dqcep-plan-svg", daemon=True).start()
            drawn = self._drawn
        drawn.wait(PLAN_WAIT)
        with self._lock:
            if self._svg_for != dot or not drawn.is_set():
                return None, "the plan is being drawn; try again in a few seconds"
            return self._svg, self._svg_why

    def _draw(self, dot: str, drawn: threading.Event) -> None:
        svg, why = None, None
        try:
            done = subprocess.run(["dot", "-Tsvg"], input=dot.encode(), capture_output=True,
                                  timeout=PLAN_DRAW_SECONDS)
            if done.returncode == 0:
                svg = done.stdout
            else:
                why = f"dot could not draw the plan: {done.stderr.decode(errors='replace')}"
        except subprocess.TimeoutExpired:
            why = (f"the plan is too large to draw within {PLAN_DRAW_SECONDS} s; /plan.dot "
                   "has it as DOT")
        except OSError as err:
            why = f"cannot run dot: {err}"
        with self._lock:
            if self._svg_for == dot:
                self._svg, self._svg_why = svg, why
        drawn.set()


# ------------------------------------------------------------------- metrics

class _Snapshot:
    """One status snapshot as ``prometheus_client``'s encoders read a registry
    (``dqcep.service.metrics`` says which figure is which metric)."""

    def __init__(self, status: dict):
        self.status = status

    def collect(self):
        from dqcep.service.metrics import families
        return families(self.status)


# ------------------------------------------------------------------- the app

def _page() -> bytes:
    return resources.files("dqcep.service").joinpath("page.html").read_bytes()


class _App:
    """The WSGI application: a handful of routes, no framework needed."""

    def __init__(self, board: Board, access: HttpAccess, changes=None):
        self.board, self.access, self.changes = board, access, changes
        self.page = _page()
        self._metrics: tuple = (None, None, b"")  # (snapshot, content type, its text)

    def __call__(self, environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "/")
        try:
            status, headers, body = self._route(environ, method, path)
        except Exception as err:  # noqa: BLE001 - one bad request never stops the service
            status, headers, body = _text(500, f"internal error: {type(err).__name__}: "
                                               f"{err}")
        start_response(status, headers + [("Content-Length", str(len(body)))])
        return [body]

    def _metrics_text(self, accept: str) -> tuple[str, bytes]:
        """The newest snapshot in the format the scraper asks for (``Accept``),
        encoded once per snapshot and format, whoever scrapes how often."""
        from prometheus_client.exposition import choose_encoder
        encode, content_type = choose_encoder(accept)
        status = self.board.status()
        done_for, done_type, body = self._metrics
        if done_for is not status or done_type != content_type:
            body = encode(_Snapshot(status))
            self._metrics = (status, content_type, body)
        return content_type, body

    def _authorized(self, environ) -> bool:
        return authorized(self.access, environ.get("HTTP_AUTHORIZATION"))

    def _route(self, environ, method: str, path: str):
        reading = method in ("GET", "HEAD")
        if not self.access.own_host(environ.get("HTTP_HOST")):
            return _misdirected(environ.get("HTTP_HOST"))
        if not self._authorized(environ):
            if not reading:
                return _text(401 if self.access.token else 403,
                             "a change needs the service's token: Authorization: Bearer "
                             "TOKEN" if self.access.token else
                             "this service takes no changes: it was started without "
                             "--http-token-file")
            if not self.access.loopback:
                return _text(401, "this address needs the service's token: "
                             "Authorization: Bearer TOKEN")
        if reading:
            if path == "/":
                return "200 OK", [("Content-Type", "text/html; charset=utf-8")], self.page
            if path == "/status":
                return _json(200, self.board.status())
            if path == "/queries":
                return _json(200, {"queries": self.board.status().get("queries", [])})
            if path == "/metrics":
                content_type, body = self._metrics_text(environ.get("HTTP_ACCEPT", ""))
                return "200 OK", [("Content-Type", content_type)], body
            if path == "/plan.svg":
                svg, why = self.board.plan_svg()
                if svg is None:
                    return _text(503, why, [("Retry-After", "5")]) if "try again" in why \
                        else _text(404, why)
                return "200 OK", [("Content-Type", "image/svg+xml")], svg
            if path == "/plan.dot":
                return "200 OK", [("Content-Type", "text/vnd.graphviz; charset=utf-8")], \
                    self.board.plan_dot.encode()
            return _text(404, f"no page {path}: /, /status, /queries, /metrics, /plan.svg, "
                         "/plan.dot")
        if self.changes is None:
            return _text(405, f"{method} {path}: nothing here can be changed")
        try:
            size = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            size = -1
        if not 0 <= size <= MAX_BODY:
            return _text(400, f"a change's body is at most {MAX_BODY} bytes")
        body = environ["wsgi.input"].read(size) if size else b""
        code, answer = self.changes(method, path, body)
        return _json(code, answer)


def authorized(access: HttpAccess, header: str | None) -> bool:
    """Whether an ``Authorization`` header carries the service's token (the scheme's
    case is free, RFC 7235), compared in constant time."""
    if access.token is None or not header:
        return False
    scheme, _, given = header.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode("utf-8", "replace"), access.token.encode())


def _misdirected(host: str | None):
    return _text(421, f"Host {host!r} is not this service's name: use its address, "
                 "localhost, this machine's name, or one given by --http-host"
                 if host else "a request must name the service in its Host header")


def _text(code: int, message: str, headers=()):
    reason = {200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized",
              403: "Forbidden",
              404: "Not Found", 405: "Method Not Allowed", 409: "Conflict",
              421: "Misdirected Request",
              500: "Internal Server Error", 503: "Service Unavailable"}[code]
    return f"{code} {reason}", [("Content-Type", "text/plain; charset=utf-8"),
                                *headers], (message + "\n").encode()


def _finite(obj):
    """JSON's numbers are finite: an infinite or NaN figure goes out as null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _json(code: int, obj) -> tuple:
    status = _text(code, "")[0]
    return status, [("Content-Type", "application/json"), ("Cache-Control", "no-store")], \
        json.dumps(_finite(obj), allow_nan=False, default=str).encode()


def _server_class(access: HttpAccess):
    """waitress's TCP server, with a parser that judges a request by its headers before
    its body is read, and a maintenance that cuts off requests slower than
    ``REQUEST_SECONDS``."""
    from waitress.parser import HTTPRequestParser
    from waitress.channel import HTTPChannel
    from waitress.server import TcpWSGIServer
    from waitress.utilities import Error

    class Refused(Error):
        def __init__(self, code: int, reason: str, body: str):
            super().__init__(body)
            self.code, self.reason = code, reason

    class Parser(HTTPRequestParser):
        def __init__(self, adj):
            super().__init__(adj)
            self.started = time.monotonic()

        def parse_header(self, header_plus):
            super().parse_header(header_plus)
            if not (self.content_length > 0 or self.chunked):
                return  # nothing to read: the app answers
            host = self.headers.get("HOST")
            if not access.own_host(host):
                _, _, body = _misdirected(host)
                self.error = Refused(421, "Misdirected Request", body.decode())
            elif not authorized(access, self.headers.get("AUTHORIZATION")):
                self.error = Refused(401, "Unauthorized",
                                     "a request with a body needs the service's token: "
                                     "Authorization: Bearer TOKEN" if access.token else
                                     "this service takes no changes: it was started "
                                     "without --http-token-file")
            else:
                return
            self.completed = True  # its body is never read: the connection closes

    class Channel(HTTPChannel):
        parser_class = Parser

    class Server(TcpWSGIServer):
        channel_class = Channel

        def maintenance(self, now):
            super().maintenance(now)
            cutoff = time.monotonic() - REQUEST_SECONDS
            for channel in list(self.active_channels.values()):
                request = channel.request
                if request is not None and not request.completed and \
                        request.started < cutoff:
                    channel.will_close = True  # headers or body too slow (slowloris)

    return Server


class HttpServer:
    """The HTTP side in a thread of its own; ``close()`` stops it."""

    def __init__(self, board: Board, access: HttpAccess, changes=None):
        from waitress.adjustments import Adjustments
        from waitress.task import ThreadedTaskDispatcher
        self.app = _App(board, access, changes)
        adj = Adjustments(host=access.host, port=access.port, threads=2,
                          clear_untrusted_proxy_headers=True, ident="dqcep",
                          max_request_body_size=MAX_BODY + 1,
                          inbuf_overflow=MAX_BODY + (1 << 10),  # bodies kept in memory
                          connection_limit=CONNECTIONS, channel_timeout=REQUEST_SECONDS * 3,
                          cleanup_interval=1, asyncore_use_poll=True)
        dispatcher = ThreadedTaskDispatcher()
        dispatcher.set_thread_count(adj.threads)
        server, shared = _server_class(access), {}
        try:  # one socket per address the host names (as waitress's create_server)
            for sockinfo in adj.listen:
                self.server = server(self.app, shared, dispatcher=dispatcher, adj=adj,
                                     sockinfo=sockinfo)
        except OSError as err:
            raise UserError(f"--http {access.host}:{access.port}: cannot listen there: "
                            f"{err.strerror or err}") from None
        self.host, self.port = self.server.getsockname()[:2]
        self.thread = threading.Thread(target=self.server.run, name="dqcep-http",
                                       daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> "HttpServer":
        self.thread.start()
        return self

    def close(self) -> None:
        self.server.close()
        self.server.task_dispatcher.shutdown(timeout=1)
