"""The service's HTTP side (--http): /status, Prometheus's /metrics, the live page in a
real browser, `dqcep status`, and who may read or change what."""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from dqcep.core.errors import UserError
from dqcep.lang import parse_file
from dqcep.service.http import Board, HttpAccess, _App, http_access, parse_bind
from tests.support.broker import free_port
from tests.support.service import QUERIES, Service, gen_args
from tests.support.paths import ROOT

# Each test here starts processes or a broker: the quick run leaves them out.
pytestmark = pytest.mark.integration

TOKEN = "t0ken-for-the-tests-0123456789"
SCREENSHOTS = ROOT / "build" / "screenshots"  # gitignored: where a person can look


def get(url, token=None, method="GET", body=None):
    req = urllib.request.Request(url, data=body, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers


# ------------------------------------------------------------------ options and access

def test_bind_addresses_are_read_and_checked():
    assert parse_bind("8080") == ("127.0.0.1", 8080)
    assert parse_bind(":0") == ("127.0.0.1", 0)
    assert parse_bind("0.0.0.0:9100") == ("0.0.0.0", 9100)
    assert parse_bind("[::1]:9100") == ("::1", 9100)
    for bad in ("http:x", "70000", "[::1]9100", "host:"):
        with pytest.raises(UserError, match="--http"):
            parse_bind(bad)


def test_a_non_loopback_bind_needs_a_token(tmp_path):
    with pytest.raises(UserError, match="non-loopback address needs --http-token-file"):
        http_access("0.0.0.0:9100", None)
    short = private_file(tmp_path / "short", "abc\n")
    with pytest.raises(UserError, match="at least 16 characters"):
        http_access("0.0.0.0:9100", str(short))
    with pytest.raises(UserError, match="cannot read --http-token-file"):
        http_access("127.0.0.1:9100", str(tmp_path / "missing"))
    good = private_file(tmp_path / "token", TOKEN + "\n")
    assert http_access("0.0.0.0:9100", str(good)) == HttpAccess("0.0.0.0", 9100, TOKEN)
    assert http_access("127.0.0.1:0", None).token is None


def private_file(path, text):
    """A token file as the docs' recipe makes it: only its owner may read it."""
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    path.chmod(0o600)
    return path


def test_a_token_file_is_private_and_one_line_of_token_characters(tmp_path):
    """Issue 49 items 10 and 16: a world-readable file, one that is not UTF-8, holds a
    line break or non-ASCII inside the token: each refused with what to do, never a
    traceback or a token no client can send."""
    shared = tmp_path / "shared"
    shared.write_text(TOKEN + "\n")
    shared.chmod(0o644)
    with pytest.raises(UserError, match=r"may be read by others \(mode 644\); chmod 600"):
        http_access("0.0.0.0:9100", str(shared))
    for name, content, what in (("latin", b"\xff\xfe" + TOKEN.encode(), "must be ASCII"),
                                ("two", (TOKEN + "\n" + TOKEN).encode(), "one line"),
                                ("accent", ("é" + TOKEN).encode(), "must be ASCII"),
                                ("space", (TOKEN + " x").encode(), "one line")):
        with pytest.raises(UserError, match=what):
            http_access("0.0.0.0:9100", str(private_file(tmp_path / name, content)))
    # the docs' recipe makes a file the service takes
    made = subprocess.run(["sh", "-c", "python3 -c 'import secrets; "
                           "print(secrets.token_urlsafe())' > token && chmod 600 token"],
                          cwd=tmp_path)
    assert made.returncode == 0
    assert len(http_access("0.0.0.0:9100", str(tmp_path / "token")).token) >= 16


def test_the_bearer_scheme_is_case_insensitive():
    from dqcep.service.http import authorized
    access = HttpAccess("127.0.0.1", 0, TOKEN)
    for header in (f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER  {TOKEN} "):
        assert authorized(access, header), header
    for header in (None, "", TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer é"):
        assert not authorized(access, header), header


def test_the_cli_refuses_a_non_loopback_bind_without_a_token_before_it_starts(tmp_path):
    r = subprocess.run([sys.executable, "-m", "dqcep", "run", str(QUERIES), "--input",
                        "mqtt://127.0.0.1:9/x", "-o", str(tmp_path / "o.jsonl"),
                        "--http", "0.0.0.0:0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "needs --http-token-file" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "dqcep", "run", str(QUERIES), "--input",
                        str(ROOT / "examples" / "fire-events.jsonl"), "--http", ":0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--http is for the streaming service" in r.stderr, r.stderr


def call(app, method, path, token=None, host="127.0.0.1:8080"):
    """One request straight into the WSGI application (no socket: any address)."""
    seen = {}

    def start_response(status, headers):
        seen["status"], seen["headers"] = status, dict(headers)
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "HTTP_HOST": host}
    if token:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    body = b"".join(app(environ, start_response))
    return int(seen["status"].split()[0]), body


def test_who_may_read_and_who_may_change():
    board = Board("digraph {}")
    board.publish({"events_in": 3})
    # loopback without a token: read, never change
    app = _App(board, HttpAccess("127.0.0.1", 0, None))
    assert call(app, "GET", "/status")[0] == 200
    code, body = call(app, "POST", "/queries")
    assert code == 403 and b"without --http-token-file" in body
    # loopback with a token: read freely, change only with it
    app = _App(board, HttpAccess("127.0.0.1", 0, TOKEN))
    assert call(app, "GET", "/metrics")[0] == 200
    assert call(app, "DELETE", "/queries/x")[0] == 401
    assert call(app, "DELETE", "/queries/x", token="wrong" * 5)[0] == 401
    assert call(app, "DELETE", "/queries/x", token=TOKEN)[0] == 405  # nothing to change yet
    # another address: even reading needs it
    app = _App(board, HttpAccess("0.0.0.0", 0, TOKEN))
    code, body = call(app, "GET", "/status")
    assert code == 401 and b"needs the service's token" in body
    assert call(app, "GET", "/", token=TOKEN)[0] == 200
    assert call(app, "GET", "/nothing", token=TOKEN)[0] == 404


def test_metrics_of_a_thousand_queries_cost_what_twenty_do():
    """Issue 49 item 14: with 1,000 queries /metrics was 1.1 MB and 0.25 s a scrape
    (the service at 0.78x while scraped each second). The series labelled by query are
    those of at most METRIC_QUERIES: the ones stopped by their budget, then those
    holding the most state; the text is encoded once per snapshot."""
    from dqcep.service.metrics import METRIC_QUERIES
    from dqcep.service.response import ResponseTimes

    def status(n):
        names = [f"q{i:04d}" for i in range(n)]
        times = ResponseTimes(names)
        return {"events_in": 5, "matches_out": n, "query_count": n,
                "matches_by_query": dict.fromkeys(names, 1),
                "state_bytes": {q: 1000 + i for i, q in enumerate(names)},
                "stopped_by_query": {q: int(q == "q0003") for q in names},
                "response": times.totals(histogram=True)}

    def served(n):
        board = Board("digraph {}")
        board.publish(status(n))
        app = _App(board, HttpAccess("127.0.0.1", 0, None))
        code, body = call(app, "GET", "/metrics")
        assert code == 200
        return board, app, body, metrics_of(body.decode())
    _, _, small, m = served(METRIC_QUERIES)
    assert m[("dqcep_metric_queries", ())] == METRIC_QUERIES
    board, app, large, m = served(1000)
    per_query = {dict(labels)["query"] for (name, labels) in m
                 if name == "dqcep_query_state_bytes"}
    # the stopped query, then the 19 holding the most state
    assert per_query == {"q0003"} | {f"q{i:04d}" for i in range(981, 1000)}
    for name in ("dqcep_query_matches_total", "dqcep_query_stopped",
                 "dqcep_response_time_seconds_count"):
        assert {dict(labels)["query"] for (n, labels) in m if n == name} == per_query, name
    assert m[("dqcep_queries", ())] == 1000 and m[("dqcep_metric_queries", ())] == 20
    assert m[("dqcep_matches_out_total", ())] == 1000
    assert len(large) < 1.2 * len(small)
    # one snapshot, one encoding: the next scrape is the same bytes object
    assert app._metrics[2] is large and call(app, "GET", "/metrics")[1] == large
    board.publish(status(5))
    assert metrics_of(call(app, "GET", "/metrics")[1].decode())[("dqcep_queries", ())] == 5


def test_a_request_must_name_the_service_in_its_host():
    """Issue 49 item 8: a page of another origin whose DNS name was rebound to the
    service's address sends its own name: refused (421), token or not; the service's
    addresses, localhost, this machine's name and --http-host names are its own."""
    import socket
    board = Board("digraph {}")
    board.publish({"events_in": 3, "queries": [{"name": "fire", "text": "secret"}]})
    app = _App(board, HttpAccess("127.0.0.1", 0, None, ("cep.example.org",)))
    for host in ("attacker.example:8080", "attacker.example", "localhost.attacker.example",
                 None, ""):
        code, body = call(app, "GET", "/status", host=host)
        assert code == 421 and b"secret" not in body, (host, body)
    for host in ("127.0.0.1:8080", "localhost:8080", "LOCALHOST", "[::1]:8080", "10.1.2.3",
                 "cep.example.org:8080", socket.gethostname()):
        assert call(app, "GET", "/status", host=host)[0] == 200, host
    with pytest.raises(UserError, match="--http-host"):
        http_access("127.0.0.1:0", None, ["bad name/"])


# ------------------------------------------------------------------ a running service

def metrics_of(text):
    """{(sample name, labels as a sorted tuple): value} by prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def quiet_status(base, n_events, timeout=60):
    """/status once every event is in and two snapshots in a row agree (the service is
    idle: what /metrics says next is the same snapshot's)."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        s = json.loads(get(base + "status")[1])
        if s.get("events_in", 0) >= n_events and s.get("lag_records") == 0:
            same = last is not None and all(
                s[k] == last[k] for k in ("events_in", "matches_out", "payloads"))
            if same:
                return s
            last = s
        time.sleep(0.6)
    raise AssertionError(f"the service did not go quiet: {last}")


@pytest.fixture
def http_service(mosquitto, tmp_path):
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/http"
    http = free_port()
    svc = Service(tmp_path, url)
    svc.args += ["--http", f"127.0.0.1:{http}", "--lateness", "50"]
    svc.start()
    n = 6_000
    # late events, repeats and hostile payloads: every reason the page shows
    pub = subprocess.run(gen_args(n, url, ["--late", "0.02", "--late-max", "5000",
                                           "--duplicates", "0.01", "--malformed", "0.005"]),
                         capture_output=True)
    assert pub.returncode == 0, pub.stderr
    from tests.support.service import publish_all
    publish_all(host, port, "dqcep/http", [b"\xc1 not msgpack", b'{"id": 1}'])
    base = f"http://127.0.0.1:{http}/"
    yield svc, base, n
    svc.stop()


def test_metrics_are_the_status_and_dqcep_status_prints_them(http_service):
    svc, base, n = http_service
    quiet_status(base, n * 0.9)
    for _ in range(50):  # /status, /metrics, /status of one snapshot (a new one: 0.5 s)
        s = json.loads(get(base + "status")[1])
        code, text, headers = get(base + "metrics")
        assert code == 200 and headers["Content-Type"].startswith("text/plain; version=")
        m = metrics_of(text.decode())
        if json.loads(get(base + "status")[1])["time"] == s["time"]:
            break
    else:
        raise AssertionError("no two requests in a row saw the same snapshot")

    def one(name, **labels):
        return m[(name, tuple(sorted(labels.items())))]
    assert one("dqcep_events_in_total") == s["events_in"]
    assert one("dqcep_payloads_total") == s["payloads"]
    assert one("dqcep_matches_out_total") == s["matches_out"] > 0
    assert {r: one("dqcep_late_events_total", reason=r) for r in s["late_by_reason"]} == \
        s["late_by_reason"] and sum(s["late_by_reason"].values()) == s["late"] > 0
    assert one("dqcep_ticks_total") == s["ticks"]
    assert one("dqcep_watermark_milliseconds") == s["watermark"]
    assert one("dqcep_event_time_milliseconds") == s["event_time"] > s["watermark"] - 1
    assert one("dqcep_repeated_events_total") == s["duplicates"] > 0
    assert one("dqcep_lag_records") == s["lag_records"] == 0
    assert one("dqcep_journal_bytes") == s["journal_bytes"] > 0
    assert one("dqcep_engine_state_bytes") == s["state_total_bytes"] > 0
    assert one("dqcep_checkpoint_age_seconds") == s["checkpoint_age_s"]
    assert one("dqcep_output_backlog_matches") == s["output_backlog"] == 0  # quiet: written
    assert one("dqcep_status_time_seconds") == s["time"]
    assert one("dqcep_queries") == len(s["queries"]) == len(parse_file(QUERIES).queries)
    assert {r: one("dqcep_dead_letters_total", reason=r) for r in s["dead_letters"]} == \
        s["dead_letters"] and s["dead_letters"]["payload"] >= 2
    names = [q["name"] for q in s["queries"]]
    assert sum(s["matches_by_query"].values()) == s["matches_out"]
    for q in names:
        assert one("dqcep_query_matches_total", query=q) == s["matches_by_query"][q]
        assert one("dqcep_query_state_bytes", query=q) == s["state_bytes"][q]
        assert one("dqcep_query_stopped", query=q) == 0
        r = s["response"][q]
        assert one("dqcep_response_time_seconds_count", query=q) == r["matches"]
        assert one("dqcep_response_time_seconds_bucket", query=q, le="+Inf") == r["matches"]
        assert one("dqcep_response_time_seconds_sum", query=q) == pytest.approx(
            r["histogram"]["sum_s"])
    # the terminal summary: the same figures
    out = subprocess.run([sys.executable, "-m", "dqcep", "status", base], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"events in {s['events_in']:,}" in out.stdout
    assert f"matches out {s['matches_out']:,}" in out.stdout
    for q in names:
        assert re.search(rf"^{q}\s+{s['matches_by_query'][q]:,}\s", out.stdout, re.M), out.stdout
    # a service that is not there: one line, exit 2
    gone = subprocess.run([sys.executable, "-m", "dqcep", "status",
                           f"http://127.0.0.1:{free_port()}/"], capture_output=True,
                          text=True, timeout=60)
    assert gone.returncode == 2 and "cannot reach the service" in gone.stderr


def chromium():
    """A headless Chromium driven by chromedriver (Debian's chromium and chromium-driver;
    scripts/system-deps.sh installs them). Fails, never skips, when they are missing."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    assert binary and driver, "Chromium and chromedriver are not installed " \
        "(sh scripts/system-deps.sh: apt-get install chromium chromium-driver)"
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1800", "--disable-gpu"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=DriverService(executable_path=driver))


def table_rows(browser, rows_css: str, attr: str) -> list:
    """(the row's ``attr``, its cells' texts) of each row, read in one script: the page
    redraws its tables as it polls, and rows found one by one went stale between two
    reads (StaleElementReferenceException in CI)."""
    return [tuple(r) for r in browser.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(r => "
        "[r.getAttribute(arguments[1]), "
        "Array.from(r.querySelectorAll('td')).map(c => c.innerText.trim())]);",
        rows_css, attr)]


def test_the_live_page_shows_what_status_says(http_service):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    svc, base, n = http_service
    s = quiet_status(base, n * 0.9)
    browser = chromium()
    try:
        browser.get(base)
        WebDriverWait(browser, 30).until(
            lambda b: b.find_element(By.ID, "events-in").text == f"{s['events_in']:,}")

        def text(id_):
            return browser.find_element(By.ID, id_).text
        assert text("matches-out") == f"{s['matches_out']:,}"
        assert text("late") == f"{s['late']:,}" and text("repeats") == f"{s['duplicates']:,}"
        assert text("lag") == "0"
        assert text("dead") == f"{sum(s['dead_letters'].values()):,}"
        shown = dict(table_rows(browser, "#queries tbody tr", "data-query"))
        assert list(shown) == [q["name"] for q in s["queries"]]
        for q, cells in shown.items():
            assert cells[1] == f"{s['matches_by_query'][q]:,}"
            mean = s["response"][q]["mean_ms"]
            assert cells[2] == ("–" if mean is None else f"{mean:.1f}")
            assert cells[5] == "running"
        reasons = {r: cells[1] for r, cells in table_rows(browser, "#reasons tbody tr",
                                                          "data-reason")}
        assert reasons == {**{k: f"{v:,}" for k, v in s["dead_letters"].items()},
                           "late": f"{s['late']:,}", "repeated": f"{s['duplicates']:,}",
                           **{f"late-{k}": f"{v:,}" for k, v in s["late_by_reason"].items()}}
        assert text("ticks") == f"{s['ticks']:,}"
        last = table_rows(browser, "#last-matches tbody tr", "data-query")
        assert len(last) == len(s["last_matches"]) > 0
        newest = s["last_matches"][-1]
        # as /status has it: the time as people read it beside the ms, the RETURN values
        assert last[0][0] == newest["query"] and last[0][1][:3] == [
            newest["query"], newest["detected"], str(newest["detected_at"])]
        assert last[0][1][3] == ", ".join(f"{k} = {json.dumps(v)}"
                                          for k, v in newest.get("return", {}).items())
        # the charts have points, the plan is drawn (an SVG the browser could load)
        assert browser.find_elements(By.CSS_SELECTOR, "#chart-rate polyline")
        WebDriverWait(browser, 30).until(lambda b: b.execute_script(
            "const i = document.getElementById('plan-img'); "
            "return i.complete && i.naturalWidth > 0;"))
        # it refreshes by itself: the snapshot time it shows moves on
        shown_at = float(browser.find_element(By.TAG_NAME, "body").get_attribute("data-time"))
        WebDriverWait(browser, 30).until(lambda b: float(b.find_element(
            By.TAG_NAME, "body").get_attribute("data-time")) > shown_at)
        # nothing came from anywhere but the service
        sources = browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)")
        assert sources and all(u.startswith(base) for u in sources), sources
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shot = SCREENSHOTS / "service-page.png"
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        print(f"screenshot: {shot}")
    finally:
        browser.quit()


def test_workers_serve_the_same_side(mosquitto, tmp_path):
    """--workers 2 --http: the coordinator's /status and /metrics, per query as its
    consumer counted, per worker whether it runs; dqcep status lists the workers."""
    host, port = mosquitto
    url = f"mqtt://{host}:{port}/dqcep/http-workers"
    http = free_port()
    svc = Service(tmp_path, url)
    svc.args += ["--http", f"127.0.0.1:{http}", "--workers", "2", "--state",
                 str(tmp_path / "state")]
    svc.start(before=1)
    try:
        n = 4_000
        assert subprocess.run(gen_args(n, url), capture_output=True).returncode == 0
        base = f"http://127.0.0.1:{http}/"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            s = json.loads(get(base + "status")[1])
            if s.get("events_in", 0) >= n * 0.95 and s.get("lag_records") == 0 and \
                    all(r.get("offset") for r in s["queries_by_name"].values()):
                break
            time.sleep(0.5)
        for _ in range(50):
            s = json.loads(get(base + "status")[1])
            m = metrics_of(get(base + "metrics")[1].decode())
            if json.loads(get(base + "status")[1])["time"] == s["time"]:
                break
        names = [q["name"] for q in s["queries"]]
        assert names == [q.name for q in parse_file(QUERIES).queries]
        assert [w["up"] for w in s["worker_status"]] == [1, 1]
        assert sorted(q for w in s["worker_status"] for q in w["queries"]) == sorted(names)
        for w in ("1", "2"):
            assert m[("dqcep_worker_up", (("worker", w),))] == 1
        for q in names:
            assert m[("dqcep_query_matches_total", (("query", q),))] == \
                s["matches_by_query"][q] == s["queries_by_name"][q]["matches_out"]
            assert m[("dqcep_query_state_bytes", (("query", q),))] == s["state_bytes"][q] > 0
        assert m[("dqcep_matches_out_total", ())] == s["matches_out"] == \
            sum(s["matches_by_query"].values())
        plan = get(base + "plan.svg")
        assert plan[0] == 200 and b"(alone)" in plan[1]
        out = subprocess.run([sys.executable, "-m", "dqcep", "status", base],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "worker 1: up" in out.stdout and \
            "worker 2: up" in out.stdout, out.stdout + out.stderr
    finally:
        svc.stop()


# ------------------------------------------------------------------ live queries

ADDED = """QUERY intrusion2
PATTERN SEQ(Door x, Motion y)
WHERE [room] AND x.open = true AND y.active = true
WITHIN 10 s;
QUERY smokeless
PATTERN SEQ(Temperature t, NOT Smoke s, Door d)
WHERE [room] AND t.value > 15 AND d.open = true
WITHIN 20 s
"""


def batches_of(events, size=200):
    import msgpack
    return [msgpack.packb({"events": events[i:i + size]}) for i in range(0, len(events), size)]


def by_query(lines):
    out: dict[str, set] = {}
    for line in lines:
        out.setdefault(json.loads(line)["query"], set()).add(line)
    return out


def reference_lines(text, events):
    from dqcep.core.events import event_from_mapping
    from dqcep.lang import parse
    from dqcep.baseline.reference import ReferenceMatcher
    found = ReferenceMatcher(parse(text).queries).run([event_from_mapping(e) for e in events])
    return {json.dumps(m.to_json_obj()) for m in found}


class LiveRun:
    """The stream of the live-query tests in three parts cut at random points (the
    seed is printed: a failure says it), the service's token, the queries file to
    add, and the service itself (one or with ``workers``)."""

    def __init__(self, mosquitto, tmp_path, topic, *extra):
        host, port = mosquitto
        self.broker, self.topic, self.tmp = (host, port), topic, tmp_path
        stream = tmp_path / "stream.jsonl"
        subprocess.run([sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n",
                        "9000", "--seed", "8", "--plant", str(QUERIES), "--plant-every",
                        "130000", "--quiet", "-o", str(stream)], check=True)
        self.events = [json.loads(x) for x in stream.read_text().splitlines()]
        # the changes at random points of the stream (DQCEP_LIVE_SEED=N: the same again)
        self.seed = int(os.environ.get("DQCEP_LIVE_SEED", random.randrange(1 << 30)))
        a, b = sorted(random.Random(self.seed).sample(range(1500, 7500, 100), 2))
        self.phases = [self.events[:a], self.events[a:b], self.events[b:]]
        print(f"DQCEP_LIVE_SEED={self.seed}: changes after events {a} and {b}")
        self.token = private_file(tmp_path / "token", TOKEN + "\n")
        self.added = tmp_path / "added.cep"
        self.added.write_text(ADDED)
        http = free_port()
        self.base = f"http://127.0.0.1:{http}/"
        self.svc = Service(tmp_path, f"mqtt://{host}:{port}/{topic}")
        self.svc.args += ["--http", f"127.0.0.1:{http}", "--http-token-file",
                          str(self.token), *extra]

    def publish(self, part: int) -> None:
        from tests.support.service import publish_all
        publish_all(*self.broker, self.topic, batches_of(self.phases[part]), "live-pub")
        self.svc.wait_for(sum(len(p) for p in self.phases[:part + 1]))

    def queries(self, op, *args) -> str:
        r = subprocess.run([sys.executable, "-m", "dqcep", "queries", op, self.base, *args,
                            "--token-file", str(self.token)], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def add_after_first_part(self) -> None:
        """Start the service, publish the first part, add ``ADDED`` (answered added)."""
        self.svc.start(before=1)
        self.publish(0)
        assert "added intrusion2, smokeless at journal record" in self.queries(
            "add", str(self.added))

    def listed(self) -> list[str]:
        return [x.split()[0] for x in self.queries("list").splitlines()
                if not x.startswith(" ")]

    def expected(self) -> dict[str, set]:
        """Per query, the reference on its live slice: the file's on the whole stream,
        the added ones from the second part on, intrusion up to the third."""
        file_text = QUERIES.read_text()
        want = by_query(reference_lines(file_text, self.events)
                        | reference_lines(ADDED, self.phases[1] + self.phases[2]))
        want["intrusion"] = by_query(reference_lines(
            file_text, self.phases[0] + self.phases[1]))["intrusion"]
        assert want["intrusion2"] and want["intrusion"] and want["smokeless"]
        return want


LIVE_QUERIES = ("overheating", "intrusion", "stuffy", "intrusion2", "smokeless")


def test_queries_added_and_removed_live_are_exactly_their_slices(mosquitto, tmp_path):
    """Two queries added after the first third of a stream (one shares intrusion's
    vertices and state, one has a NOT of its own), a SIGKILL after the second third
    (the change is replayed from the journal), intrusion removed after it (intrusion2
    keeps the vertices they shared): each query's output is the reference's on the
    events it was live for, each match once."""
    run = LiveRun(mosquitto, tmp_path, "dqcep/live")
    svc, base = run.svc, run.base
    svc.start()
    run.publish(0)
    # refused, nothing changed: a parse error with its place, a name it runs, no token
    bad = tmp_path / "bad.cep"
    bad.write_text("QUERY z\nPATTERN SEQ(Door d, Motion m)\nWHERE q.open = true\nWITHIN 1 s\n")
    r = subprocess.run([sys.executable, "-m", "dqcep", "queries", "add", base, str(bad),
                        "--token-file", str(run.token)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and f"{bad}:3:7: unknown variable 'q'" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "dqcep", "queries", "remove", base, "stuffy"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "401" in r.stderr, r.stderr
    code, body, _ = get(base + "queries", token=TOKEN, method="POST",
                        body=b"QUERY intrusion PATTERN Door d WITHIN 1 s")
    assert code == 400 and b"runs a query 'intrusion' already" in body
    out = run.queries("add", str(run.added))
    assert "added intrusion2, smokeless at journal record" in out and "applied" in out
    run.publish(1)
    svc.kill_and_restart()  # the change is replayed in its place
    quiet_status(base, len(run.phases[0]) + len(run.phases[1]))  # caught up: applied
    assert run.listed() == list(LIVE_QUERIES)
    assert "removed intrusion at journal record" in run.queries("remove", "intrusion")
    run.publish(2)
    # the vertices only smokeless read are freed: the engine's state bytes fall
    before = quiet_status(base, len(run.events))
    assert before["state_bytes"]["smokeless"] > 0
    assert "removed smokeless" in run.queries("remove", "smokeless")
    after = quiet_status(base, len(run.events))
    metrics = metrics_of(get(base + "metrics")[1].decode())
    assert after["state_total_bytes"] < before["state_total_bytes"]
    assert "smokeless" not in after["state_bytes"] and not any(
        dict(labels).get("query") == "smokeless" for name, labels in metrics
        if name == "dqcep_query_state_bytes")
    svc.finish()
    got = by_query(svc.output())  # each match once (output() checks)
    want = run.expected()
    for q in LIVE_QUERIES:
        assert got.get(q, set()) == want.get(q, set()), q


def test_workers_add_and_remove_queries_live(mosquitto, tmp_path):
    """The same changes with --workers 2: an added query gets a consumer of its own
    from its control record on, a removed one's consumer takes the records up to it
    and is let go; a SIGKILLed coordinator comes back with the changed set. Each
    query's output file is the reference's on its live slice."""
    run = LiveRun(mosquitto, tmp_path, "dqcep/live-workers", "--workers", "2", "--state",
                  str(tmp_path / "state"))
    svc = run.svc
    run.add_after_first_part()
    run.publish(1)
    svc.proc.kill()  # the coordinator; its workers follow it
    svc.proc.wait()
    time.sleep(1)
    svc.start(before=1)
    svc.wait_for(len(run.phases[0]) + len(run.phases[1]))
    assert run.listed() == list(LIVE_QUERIES)
    assert "removed intrusion at journal record" in run.queries("remove", "intrusion")
    run.publish(2)
    svc.finish()
    want = run.expected()
    for q in LIVE_QUERIES:
        path = tmp_path / f"out.{q}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        assert len(lines) == len(set(lines)), f"{q}: a match was written twice"
        assert set(lines) == want.get(q, set()), q


def test_every_metric_is_in_the_docs():
    """docs/operations.md's table names every metric /metrics serves."""
    from dqcep.service.metrics import HISTOGRAM, METRICS, SHOWN
    doc = (ROOT / "docs" / "operations.md").read_text()
    missing = [name for name, *_ in [*METRICS, SHOWN] if f"`{name}`" not in doc]
    assert not missing and f"`{HISTOGRAM[0]}`" in doc, missing


def test_with_targets_a_query_added_live_is_placed_by_its_calibration(mosquitto, tmp_path):
    """--target: a query the calibration has no cost of is refused (nothing journaled);
    one it has is hosted, then every query is placed again by the capacity model; its
    output is the reference's on the events after it."""
    from dqcep.service.scaling.model import Calibration, QueryCost
    cost = {q: QueryCost(q, 0.0022, 1e-5) for q in
            ("overheating", "intrusion", "stuffy", "intrusion2")}
    (tmp_path / "cal.json").write_text(json.dumps(Calibration(
        200, 100, cost, cost, 0.003, QueryCost("overhead", 0, 0), 0.0,
        QueryCost("checkpoint", 0, 0), 1.0, 0.0).to_json()))
    run = LiveRun(mosquitto, tmp_path, "dqcep/live-target", "--state", str(tmp_path / "st"),
                  "--target", "*=1000", "--calibration", str(tmp_path / "cal.json"))
    run.svc.start(before=1)
    run.publish(0)
    one, other = ADDED.split(";\n")
    code, body, _ = get(run.base + "queries", token=TOKEN, method="POST",
                        body=other.encode())
    assert code == 409 and b"has no cost of smokeless" in body, body
    (tmp_path / "one.cep").write_text(one)
    assert "added intrusion2 at journal record" in run.queries("add", str(tmp_path / "one.cep"))
    deadline = time.monotonic() + 30  # the model's placement, in the stats file
    while not any(p["why"] == "intrusion2 added" for p in json.loads(
            (tmp_path / "stats.json").read_text()).get("plans", [])):
        assert time.monotonic() < deadline, (tmp_path / "stats.json").read_text()
        time.sleep(0.2)
    run.publish(1)
    run.publish(2)
    run.svc.finish()
    lines = (tmp_path / "out.intrusion2.jsonl").read_text().splitlines()
    assert set(lines) == by_query(reference_lines(
        one, run.phases[1] + run.phases[2]))["intrusion2"] and len(lines) == len(set(lines))


# ------------------------------------------------------------------ the server's door

@pytest.fixture
def bare_server(monkeypatch):
    """The HTTP side over a board alone (no service behind it), on a free port."""
    import dqcep.service.http as http
    monkeypatch.setattr(http, "REQUEST_SECONDS", 1)
    board = Board("digraph { a -> b }")
    board.publish({"events_in": 1})
    seen = []

    def changes(method, path, body):
        seen.append(len(body))
        return 200, {"ok": True}
    server = http.HttpServer(board, HttpAccess("127.0.0.1", 0, TOKEN), changes).start()
    server.seen = seen
    yield server
    server.close()


def raw(server, data: bytes, timeout=10.0):
    import socket
    s = socket.create_connection((server.host, server.port), timeout=timeout)
    s.sendall(data)
    return s


def answer(sock) -> bytes:
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return out
        if not chunk:
            return out
        out += chunk


def test_a_body_without_the_token_is_refused_before_it_is_read(bare_server, tmp_path):
    """Issue 49 item 9: waitress stored tokenless bodies (up to 1 GiB each, spooled to
    disk) before the app answered 401. Now the headers decide: no token, another host
    or too large a body is answered at once, with the body never sent."""
    from dqcep.service.http import MAX_BODY
    head = b"POST /queries HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000\r\n\r\n"
    s = raw(bare_server, head)  # the body never follows: an answer comes all the same
    reply = answer(s)
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert b"needs the service's token" in reply
    s = raw(bare_server, head.replace(b"127.0.0.1", b"rebound.example")
            .replace(b"\r\n\r\n", f"\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()))
    assert answer(s).startswith(b"HTTP/1.1 421")
    big = f"POST /queries HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n" \
        f"Content-Length: {MAX_BODY + 1}\r\n\r\n".encode()
    assert answer(raw(bare_server, big)).startswith(b"HTTP/1.1 413")
    chunked = "POST /queries HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked" \
        "\r\n\r\n100000\r\n".encode()
    assert answer(raw(bare_server, chunked)).startswith(b"HTTP/1.1 401")
    assert bare_server.seen == []  # nothing reached the change handler
    # with the token, a body is read whole and handed on
    ok = f"POST /queries HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: bearer {TOKEN}\r\n" \
        "Content-Length: 5\r\nConnection: close\r\n\r\nhello".encode()
    assert answer(raw(bare_server, ok)).startswith(b"HTTP/1.1 200")
    assert bare_server.seen == [5]


def test_slow_connections_neither_hold_the_server_nor_stay(bare_server):
    """Issue 49 item 12: 100 connections that send their request a byte at a time took
    /status down (waitress's limit of 100 connections, kept for 120 s of activity).
    Now 150 of them leave /status answering, and each is cut off once its request has
    taken REQUEST_SECONDS (1 s here)."""
    slow = [raw(bare_server, b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-a: ")
            for _ in range(150)]
    code, body, _ = get(f"http://127.0.0.1:{bare_server.port}/status")
    assert code == 200 and json.loads(body)["events_in"] == 1
    deadline = time.monotonic() + 60
    open_ = list(slow)
    while open_ and time.monotonic() < deadline:
        for s in list(open_):
            try:
                s.send(b"a")  # still trickling: the server cuts it off regardless
                s.settimeout(0.01)
                if s.recv(1) == b"":
                    open_.remove(s)
            except TimeoutError:
                pass
            except OSError:
                open_.remove(s)
        time.sleep(0.2)
    assert not open_, f"{len(open_)} slow connections still open"
    for s in slow:
        s.close()


def test_a_plan_too_large_to_draw_holds_no_request(monkeypatch, tmp_path):
    """Issue 49 item 12: two /plan.svg requests over 2,000 queries held both HTTP
    threads for 20 s, and a drawing that timed out was tried again by the next request.
    Now one drawing at a time runs beside the server, a request waits PLAN_WAIT s at
    most (503, try again), and a drawing that timed out is not tried again."""
    import threading
    import dqcep.service.http as http
    monkeypatch.setattr(http, "PLAN_WAIT", 0.2)
    monkeypatch.setattr(http, "PLAN_DRAW_SECONDS", 1)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "dot").write_text(f"#!/bin/sh\necho run >> {tmp_path / 'runs'}\nsleep 30\n")
    (bin_ / "dot").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    board = Board("digraph { a -> b }")
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(board.plan_svg()))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert [a[0] for a in answers] == [None, None]
    assert all("try again" in why for _, why in answers)
    deadline = time.monotonic() + 30
    while "too large" not in (board.plan_svg()[1] or "") and time.monotonic() < deadline:
        time.sleep(0.1)
    svg, why = board.plan_svg()
    assert svg is None and "too large to draw" in why
    assert (tmp_path / "runs").read_text().count("run") == 1  # never drawn again
    app = _App(board, HttpAccess("127.0.0.1", 0, None))
    code, body = call(app, "GET", "/plan.svg")
    assert code == 404 and b"/plan.dot" in body


AGAIN = """QUERY intrusion
PATTERN SEQ(Motion y, Door x)
WHERE [room] AND x.open = true AND y.active = true
WITHIN 10 s
"""


def test_workers_a_removal_the_coordinator_died_in_and_a_name_used_again(mosquitto,
                                                                           tmp_path):
    """Issue 49 items 1 and 2 with --workers 2. (2) The coordinator died after journaling
    a removal whose lagging consumer had not reached it (here: the records and the
    control record journaled while the service was down): at the restart the consumer
    takes the records up to its removal first (none of them were ever written before).
    (1) A query added again under the removed one's name: the removed one's output is
    set aside whole (it was cut to 0 lines), the new one writes its own."""
    from dqcep.io.journal import Journal
    from dqcep.service.changes import CONTROL_TOPIC, control_record
    run = LiveRun(mosquitto, tmp_path, "dqcep/live-again", "--workers", "2", "--state",
                  str(tmp_path / "state"))
    svc = run.svc
    svc.start(before=1)
    run.publish(0)
    svc.stop()
    journal = Journal(tmp_path / "journal")  # the Service's --journal
    for payload in batches_of(run.phases[1]):  # journaled, never consumed
        journal.append(run.topic, payload, int(time.time() * 1e6))
    removal = journal.append(CONTROL_TOPIC, control_record("remove", name="intrusion"),
                             int(time.time() * 1e6))
    journal.commit()
    journal.close()
    try:
        svc.start(before=1)
    except AssertionError:
        time.sleep(2)
        raise AssertionError(svc.log()[-3000:]) from None
    assert "intrusion" not in run.listed()
    again = tmp_path / "again.cep"
    again.write_text(AGAIN)
    assert "added intrusion at journal record" in run.queries("add", str(again))
    run.publish(2)
    svc.finish()
    file_text = QUERIES.read_text()
    before = by_query(reference_lines(file_text, run.phases[0] + run.phases[1]))["intrusion"]
    removed = tmp_path / f"out.intrusion.removed-{removal}.jsonl"
    assert removed.exists(), sorted(p.name for p in tmp_path.iterdir())
    assert set(removed.read_text().splitlines()) == before and before
    new = (tmp_path / "out.intrusion.jsonl").read_text().splitlines()
    assert set(new) == reference_lines(AGAIN, run.phases[2]) and len(new) == len(set(new))


def test_workers_a_worker_killed_during_a_removal_still_removes_it(mosquitto, tmp_path):
    """Issue 49 item 3: a worker killed as a query it hosts was removed: the DELETE
    answered 500, the set said removed, and the restarted worker ran the query again
    past its removal. Now a removal whose worker dies is applied all the same (the
    worker is started again from its checkpoints and asked again; ``_remove``): 200,
    and the query's output is the reference's on the events before the removal. The
    worker is stopped (SIGSTOP) before the DELETE, so that the coordinator sends it the
    removal and waits for its answer, and killed while it waits: the retry path.
    Item 20: /queries has added_at."""
    run = LiveRun(mosquitto, tmp_path, "dqcep/live-kill", "--workers", "2", "--state",
                  str(tmp_path / "state"))
    svc = run.svc
    run.add_after_first_part()
    deadline, added = time.monotonic() + 30, {}
    while "intrusion2" not in added and time.monotonic() < deadline:  # the next snapshot
        time.sleep(0.1)
        added = {q["name"]: q.get("added_at", "none")
                 for q in json.loads(get(run.base + "queries")[1])["queries"]}
    assert added["overheating"] is None and isinstance(added["intrusion2"], int)
    status = quiet_status(run.base, len(run.phases[0]))
    pid = next(w["pid"] for w in status["worker_status"] if "intrusion" in w["queries"])
    import threading
    answers = []
    os.kill(pid, signal.SIGSTOP)
    removing = threading.Thread(target=lambda: answers.append(
        run.queries("remove", "intrusion")))
    removing.start()
    time.sleep(2)  # the coordinator has sent the removal to the stopped worker
    os.kill(pid, signal.SIGKILL)
    removing.join(120)
    assert answers and "removed intrusion at journal record" in answers[0], answers
    assert "intrusion" not in run.listed()
    run.publish(1)
    run.publish(2)
    svc.finish()
    want = by_query(reference_lines(QUERIES.read_text(), run.phases[0]))["intrusion"]
    lines = (tmp_path / "out.intrusion.jsonl").read_text().splitlines()
    assert set(lines) == want and len(lines) == len(want)
