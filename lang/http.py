"""A small blocking JSON-over-HTTP client (stdlib urllib) for the HTTP backends.

Program states call their backend from worker threads, so plain blocking requests fit; no extra dependency.
Failures become `ModelCallError`s carrying the status and the server's message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from radixgen.lang.backend import ModelCallError


class HttpClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    def _request(self, method: str, path: str, body: Any | None) -> urllib.request.Request:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        return urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)

    def _open(self, req: urllib.request.Request):
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:500]
            raise ModelCallError(f"{req.get_method()} {req.full_url} -> HTTP {exc.code}: {detail}") from None
        except urllib.error.URLError as exc:
            raise ModelCallError(f"{req.get_method()} {req.full_url} failed: {exc.reason}") from None

    def get(self, path: str) -> Any:
        with self._open(self._request("GET", path, None)) as resp:
            return json.loads(resp.read())

    def post(self, path: str, body: Any) -> Any:
        with self._open(self._request("POST", path, body)) as resp:
            return json.loads(resp.read())

    def post_events(self, path: str, body: Any) -> Iterator[Any]:
        """POST and read server-sent events (`data: {...}` lines) until `data: [DONE]` or the end."""
        with self._open(self._request("POST", path, body)) as resp:
            for raw in resp:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                event = json.loads(payload)
                if isinstance(event, dict) and "error" in event:
                    raise ModelCallError(f"stream from {path} failed: {event['error']}")
                yield event
