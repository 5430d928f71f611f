"""A minimal streaming HTTP proxy used as the 'router' of a disaggregated test deployment:
`python tiny_router.py PORT PREFILL_URL DECODE_URL` forwards every request to the decode server
(after a HEAD-free health check of both), copying the response line by line (SSE)."""

from __future__ import annotations

import sys
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, PREFILL, DECODE = int(sys.argv[1]), sys.argv[2], sys.argv[3]


class Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def _forward(self) -> None:
        if self.path == "/health":
            for up in (PREFILL, DECODE):
                try:
                    urllib.request.urlopen(up + "/health", timeout=2).close()
                except OSError:
                    self.send_error(503)
                    return
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        req = urllib.request.Request(
            DECODE + self.path,
            data=body,
            method=self.command,
            headers={"Content-Type": self.headers.get("Content-Type", "application/json")},
        )
        try:
            resp = urllib.request.urlopen(req, timeout=600)
        except urllib.error.HTTPError as exc:
            resp = exc
        self.send_response(resp.status if hasattr(resp, "status") else resp.code)
        self.send_header("Content-Type", resp.headers.get("Content-Type", "application/json"))
        self.end_headers()
        while line := resp.readline():
            self.wfile.write(line)
            self.wfile.flush()

    do_GET = do_POST = _forward

    def log_message(self, *args: object) -> None:
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Proxy).serve_forever()
