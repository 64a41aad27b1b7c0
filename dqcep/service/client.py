"""A client of the service's HTTP side, for ``dqcep status`` and ``dqcep queries``."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

from dqcep.core.errors import UserError

TIMEOUT = 10.0  # s to wait for the service's answer


class ServiceClient:
    """Requests to ``url`` (the service's ``--http`` address), with the token of
    ``token_file`` when given."""

    def __init__(self, url: str, token_file: str | None = None):
        if not url.startswith(("http://", "https://")):
            url = "http://" + url
        self.url = url.rstrip("/") + "/"
        self.token = None
        if token_file is not None:
            from dqcep.service.http import read_token
            self.token = read_token(token_file, "--token-file", private=False)

    def request(self, method: str, path: str, body: bytes | None = None,
                content_type: str = "text/plain; charset=utf-8") -> tuple[int, bytes]:
        """(status code, body) of one request; a refused connection is a UserError."""
        req = urllib.request.Request(self.url + path.lstrip("/"), data=body, method=method)
        if body is not None:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise UserError(f"cannot reach the service at {self.url}: {reason} (is it "
                            "running with --http?)") from None

    def get_json(self, path: str):
        code, body = self.request("GET", path)
        if code != 200:
            raise UserError(f"{self.url}{path}: {code}: {body.decode(errors='replace').strip()}")
        return json.loads(body)
