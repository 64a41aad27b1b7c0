"""Webhook outputs (issue 53, item 5): each match POSTed as JSON with its match key
(body and Idempotency-Key), a bearer token from a file, retried with backoff while the
endpoint fails, at least once."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dqcep.core.errors import UserError
from dqcep.io import sinks
from dqcep.io.match_text import match_key
from dqcep.io.sinks import WebhookMatchSink
from tests.support.paths import ROOT


class Endpoint:
    """A local HTTP server that answers ``fail`` (a list of statuses) first, then 200,
    and keeps every request it took or refused for good: (status, headers, body)."""

    def __init__(self, fail=()):
        self.fail, self.taken, self.requests = list(fail), [], 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                endpoint.requests += 1
                status = endpoint.fail.pop(0) if endpoint.fail else 200
                if status < 300 or status in sinks.WEBHOOK_REFUSED:
                    endpoint.taken.append((status, dict(self.headers), json.loads(body)))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook?x=1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fast_retries(monkeypatch):
    monkeypatch.setattr(sinks, "WEBHOOK_BACKOFF", (0.01, 0.05))


@pytest.mark.integration
def test_dqcep_run_posts_each_match_with_its_key_through_failures(tmp_path):
    """dqcep run --output http://127.0.0.1:PORT/...: the endpoint fails three times
    (503, 429, a 502) and then takes everything: every match arrives once, as the file
    output has it plus its key, with the token and the key in the headers."""
    endpoint = Endpoint(fail=[503, 429, 502])
    try:
        (tmp_path / "token").write_text("s3cret\n")
        want = subprocess.run([sys.executable, "-m", "dqcep", "run", "examples/fire.cep",
                               "--input", "examples/fire-events.jsonl"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.splitlines()
        run = subprocess.run([sys.executable, "-m", "dqcep", "run", "examples/fire.cep",
                              "--input", "examples/fire-events.jsonl", "--output", endpoint.url,
                              "--output-token-file", str(tmp_path / "token")],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert "HTTP 503; retrying" in run.stderr and "taken again" in run.stderr
        got = [body for _, _, body in endpoint.taken]
        assert endpoint.requests == len(want) + 3
        assert sorted(json.dumps({k: v for k, v in b.items() if k != "key"}) for b in got) \
            == sorted(want)
        for _, headers, body in endpoint.taken:
            assert body["key"] == match_key(body["query"], body["events"])
            assert headers["Idempotency-Key"] == body["key"]
            assert headers["Authorization"] == "Bearer s3cret"
    finally:
        endpoint.close()


def test_a_refused_match_is_said_and_left_out(fast_retries):
    from dqcep.core.events import Match
    endpoint = Endpoint(fail=[422])
    said = []
    try:
        sink = WebhookMatchSink(endpoint.url, say=said.append)
        a, b = Match("q", 5, (("x", 1),)), Match("q", 6, (("x", 2),))
        assert sink.write_matches([a, b]) == 2
        assert (sink.sent, sink.refused) == (1, 1) and "HTTP 422" in said[0]
        assert [body["events"] for _, _, body in endpoint.taken] == [{"x": 1}, {"x": 2}]
        sink.close()
    finally:
        endpoint.close()


@pytest.mark.integration
def test_keys_are_stable_and_tell_matches_apart():
    assert match_key("q", {"a": 1, "b": [2, 3]}) == match_key("q", {"a": 1, "b": [2, 3]})
    assert len({match_key("q", {"a": 1}), match_key("r", {"a": 1}),
                match_key("q", {"a": 2}), match_key("q", {"b": 1})}) == 4
    out = subprocess.run([sys.executable, "-c", "from dqcep.io.match_text import match_key;"
                          "print(match_key('q', {'a': 1}))"], capture_output=True, text=True)
    assert out.stdout.strip() == match_key("q", {"a": 1})  # no salted hash


@pytest.mark.parametrize("url, message", [
    ("http://example.com/hook", "only on loopback"),
    ("https:///hook", "no host"),
])
def test_webhooks_in_clear_text_beyond_loopback_are_refused(url, message):
    with pytest.raises(UserError, match=message):
        WebhookMatchSink(url)


def test_a_token_file_must_hold_one_line(tmp_path):
    (tmp_path / "t").write_text("a\nb\n")
    with pytest.raises(UserError, match="must hold one line"):
        WebhookMatchSink("http://127.0.0.1:1/h", token_file=str(tmp_path / "t"))
    with pytest.raises(UserError, match="cannot read the webhook token file"):
        WebhookMatchSink("http://127.0.0.1:1/h", token_file=str(tmp_path / "missing"))


def test_the_service_posts_what_it_writes_to_a_file(tmp_path, fast_retries):
    """The streaming service over a journal (in-process): a webhook output that fails
    and recovers gets, each once, the matches a file output gets (keys apart)."""
    import dataclasses

    from tests.support.journal_service import config, finish, iot_payloads, journal_payloads
    for name in ("file", "hook"):
        (tmp_path / name).mkdir()
        journal_payloads(tmp_path / name, iot_payloads(3000))
    finish(config(tmp_path / "file", tick=0))
    want = (tmp_path / "file" / "out.jsonl").read_text().splitlines()
    endpoint = Endpoint(fail=[503, 500])
    try:
        finish(dataclasses.replace(config(tmp_path / "hook", tick=0), output=endpoint.url))
        got = [json.dumps({k: v for k, v in body.items() if k != "key"})
               for _, _, body in endpoint.taken]
        assert want and sorted(got) == sorted(want)
        assert endpoint.requests == len(want) + 2  # the two failures, tried again
    finally:
        endpoint.close()
