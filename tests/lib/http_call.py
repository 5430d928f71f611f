"""One HTTP request to a server under test on loopback, as a client sees it: (status, the body
parsed as JSON, or its text when it is not JSON). Error statuses are answers, not exceptions."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def call(url: str, path: str, body: object | None = None, timeout: float = 60,
         raw: bytes | None = None) -> tuple[int, object]:
    """POST `body` as JSON (or the bytes `raw`) to `url + path`, or GET when neither is given."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url + path, data=data, method="POST" if data is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def sse(url: str, path: str, body: dict) -> list[dict]:
    """A streamed answer's events (JSON objects), checked to be a 200 that ends with [DONE]."""
    status, text = call(url, path, body)
    assert status == 200, text
    events = [ln[6:] for ln in text.split("\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]
