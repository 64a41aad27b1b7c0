"""The service's HTTP side (``--http HOST:PORT``): what an operator sees of it.

    GET /          a live page (``dqcep/service/page.html``: throughput and lag over
                   the last minutes, matches and response times per query, dead
                   letters and late events by reason, the last matches, the plan)
    GET /status    the stats JSON (what ``--stats-file`` holds) and the query set
    GET /metrics   the same figures in Prometheus's exposition format
    GET /plan.svg  the shared DAG as ``dqcep explain --dot`` draws it (Graphviz)

The server is waitress (a maintained, pure-Python WSGI server with a thread pool) in
a thread of its own. It never reads the engine: the engine belongs to the service's
thread, which publishes a snapshot of its figures to the ``Board`` every
``PUBLISH_EVERY`` seconds; every request answers from the newest snapshot, so
``/status`` and ``/metrics`` of one snapshot agree exactly, and a scrape costs the
service nothing but that snapshot.

Access: a bind to a non-loopback address needs ``--http-token-file`` (every request
then carries ``Authorization: Bearer TOKEN``); on loopback the read-only endpoints
are open and only a change (``POST``/``DELETE``) needs the token.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import math
import shutil
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from importlib import resources

from dqcep.errors import UserError

PUBLISH_EVERY = 0.5     # s between the service's snapshots for the HTTP side
HISTORY_SECONDS = 600   # how far back the page's charts reach
LAST_MATCHES = 20       # matches the page lists
MAX_BODY = 1 << 20      # bytes of a change's body (a query file's text), at most
DEFAULT_HOST = "127.0.0.1"


# ------------------------------------------------------------------- options

@dataclass(frozen=True)
class HttpAccess:
    """Where the HTTP side listens and the token a request must carry (None: no
    token; then only loopback is allowed and nothing can be changed)."""

    host: str
    port: int
    token: str | None = None

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)


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


def http_access(bind: str, token_file: str | None) -> HttpAccess:
    """The ``--http`` and ``--http-token-file`` options, checked."""
    host, port = parse_bind(bind)
    token = None
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as err:
            raise UserError(f"cannot read --http-token-file {token_file}: "
                            f"{err.strerror}") from None
        if len(token) < 16:
            raise UserError(f"--http-token-file {token_file}: the token must be at least "
                            "16 characters (e.g. python3 -c 'import secrets; "
                            "print(secrets.token_urlsafe())')")
    if token is None and not is_loopback(host):
        raise UserError(f"--http {bind}: a non-loopback address needs --http-token-file "
                        "(anyone who reaches it could read the service and change its "
                        "queries); bind 127.0.0.1 to go without one")
    return HttpAccess(host, port, token)


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
        self._svg_for: str | None = None

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

    def plan_svg(self) -> bytes | None:
        """The plan drawn by Graphviz's ``dot`` (None where it is not installed),
        drawn again only when the plan changed."""
        with self._lock:
            dot = self.plan_dot
            if self._svg_for == dot:
                return self._svg
        svg = None
        if shutil.which("dot"):
            done = subprocess.run(["dot", "-Tsvg"], input=dot.encode(), capture_output=True,
                                  timeout=30)
            svg = done.stdout if done.returncode == 0 else None
        with self._lock:
            self._svg, self._svg_for = svg, dot
        return svg


# ------------------------------------------------------------------- metrics

class _Collector:
    """``prometheus_client`` collector over the board's snapshot (``dqcep.service.
    metrics`` says which figure is which metric)."""

    def __init__(self, board: Board):
        self.board = board

    def collect(self):
        from dqcep.service.metrics import families
        return families(self.board.status())


# ------------------------------------------------------------------- the app

def _page() -> bytes:
    return resources.files("dqcep.service").joinpath("page.html").read_bytes()


class _App:
    """The WSGI application: a handful of routes, no framework needed."""

    def __init__(self, board: Board, access: HttpAccess, changes=None):
        from prometheus_client import CollectorRegistry
        self.board, self.access, self.changes = board, access, changes
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(board))
        self.page = _page()

    def __call__(self, environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "/")
        try:
            status, headers, body = self._route(environ, method, path)
        except Exception as err:  # noqa: BLE001 - one bad request never stops the service
            status, headers, body = _text(500, f"internal error: {type(err).__name__}: "
                                               f"{err}")
        start_response(status, headers + [("Content-Length", str(len(body)))])
        return [body]

    def _authorized(self, environ) -> bool:
        if self.access.token is None:
            return False
        given = environ.get("HTTP_AUTHORIZATION", "")
        return given.startswith("Bearer ") and hmac.compare_digest(
            given[7:].strip().encode(), self.access.token.encode())

    def _route(self, environ, method: str, path: str):
        reading = method in ("GET", "HEAD")
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
            if path == "/metrics":  # the format the scraper asks for (Accept)
                from prometheus_client.exposition import choose_encoder
                encode, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
                return "200 OK", [("Content-Type", content_type)], encode(self.registry)
            if path == "/plan.svg":
                svg = self.board.plan_svg()
                if svg is None:
                    return _text(404, "the plan is drawn by Graphviz's dot, which is not "
                                 "installed here; /status has it as DOT (plan_dot)")
                return "200 OK", [("Content-Type", "image/svg+xml")], svg
            if path == "/plan.dot":
                return "200 OK", [("Content-Type", "text/vnd.graphviz; charset=utf-8")], \
                    self.board.plan_dot.encode()
            return _text(404, f"no page {path}: /, /status, /metrics, /plan.svg")
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


def _text(code: int, message: str):
    reason = {200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized",
              403: "Forbidden",
              404: "Not Found", 405: "Method Not Allowed", 409: "Conflict",
              500: "Internal Server Error", 503: "Service Unavailable"}[code]
    return f"{code} {reason}", [("Content-Type", "text/plain; charset=utf-8")], \
        (message + "\n").encode()


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


class HttpServer:
    """The HTTP side in a thread of its own; ``close()`` stops it."""

    def __init__(self, board: Board, access: HttpAccess, changes=None):
        from waitress.server import create_server
        self.app = _App(board, access, changes)
        try:
            self.server = create_server(self.app, host=access.host, port=access.port,
                                        threads=2, clear_untrusted_proxy_headers=True,
                                        ident="dqcep")
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
