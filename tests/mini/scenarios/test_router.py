"""`servelab router --pd-disaggregation` on its own: its flags as sglang_router spells them
(one-line errors for bad ones), its bind errors, and a decode worker that breaks off mid-stream
(fake workers on loopback). Routing real prefill/decode servers is test_pd_server.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

from serve_proc import free_port, start, wait_ready

from servelab.engines.base import parse_prometheus


def call(url: str, path: str, body: dict | None = None, timeout: float = 20):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method="POST" if data else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_router_on_a_host_that_does_not_resolve_says_check_host():
    r = subprocess.run([sys.executable, "-m", "servelab", "router", "--pd-disaggregation",
                        "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2",
                        "--host", "no-such-host.invalid", "--port", str(free_port())],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "check --host" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def _fake_worker(answer: bytes, linger_s: float = 0.0):
    """An HTTP server on loopback that answers every POST with `answer` (raw bytes of status
    line, headers and body), waits `linger_s` and closes the connection. (aiohttp drops bytes
    still buffered when it sees the connection break, so a worker that breaks off lingers for
    what it sent to be forwarded first.)"""
    import http.server
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.wfile.write(answer)
            self.wfile.flush()
            time.sleep(linger_s)
            self.close_connection = True

        def log_message(self, *_args) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_a_decode_stream_that_breaks_off_ends_with_an_error_event():
    """The decode server dies mid-stream (its chunked body never ends): the client gets the
    chunks that came, then an error event and [DONE], not a stream that just stops."""
    chunk = b'data: {"choices": [{"text": "ab"}]}\n\n'
    prefill = _fake_worker(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 2\r\n\r\n{}")
    decode = _fake_worker(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n"
                          + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n", linger_s=0.5)
    router, port = start("router", "--pd-disaggregation", "--prefill",
                          f"http://127.0.0.1:{prefill.server_address[1]}", "--decode",
                          f"http://127.0.0.1:{decode.server_address[1]}")
    try:
        wait_ready(router)
        st, text = call(f"http://127.0.0.1:{port}", "/v1/completions",
                        {"prompt": "x", "stream": True}, timeout=20)
        events = [ln[6:] for ln in text.split("\n") if ln.startswith("data: ")]
        assert st == 200 and events[0] == '{"choices": [{"text": "ab"}]}', text
        assert "broke off" in json.loads(events[1])["error"]["message"] and events[2] == "[DONE]"
        m = parse_prometheus(call(f"http://127.0.0.1:{port}", "/metrics")[1])
        assert m['servelab:router_upstream_errors_total{role="decode"}'] == 1
    finally:
        router.kill()
        router.wait()
        for s in (prefill, decode):
            s.shutdown()
            s.server_close()


def _worker_with_metrics():
    """A worker on loopback: GETs answer 200 with one Prometheus sample, POSTs 200 `{}`."""
    import http.server
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def _answer(self, body: bytes, ctype: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._answer(b"worker_up 1\n", "text/plain")

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._answer(b"{}", "application/json")

        def log_message(self, *_args) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_worker_url_credentials_are_never_shown():
    """Before: the password of `--prefill http://u:PW@...` was in the ready line, /server_info
    (any client reads it), the /metrics `worker=` label, 502 bodies and /health."""
    pw = "Pw-7fQ2sLx9"
    worker, dead = _worker_with_metrics(), free_port()
    good = f"http://u:{pw}@127.0.0.1:{worker.server_address[1]}"
    bad = f"http://u:{pw}@127.0.0.1:{dead}"
    seen: list[str] = []
    routers = []
    try:
        for decode in (good, bad):
            r, port = start("router", "--pd-disaggregation", "--prefill", good, "--decode", decode)
            routers.append(r)
            seen.append(r.stdout.readline())           # the ready line
            assert "router ready" in seen[-1], seen[-1]
            url = f"http://127.0.0.1:{port}"
            answers = [call(url, "/server_info"), call(url, "/metrics"), call(url, "/health"),
                       call(url, "/v1/completions", {"prompt": "x", "max_tokens": 1})]
            seen += [text for _, text in answers]
            if decode == good:
                assert 'worker="http://<redacted>@127.0.0.1' in answers[1][1], answers[1][1]
                assert "<redacted>@" in answers[0][1]
            else:
                assert answers[2][0] == 503 and answers[3][0] == 502, answers
                assert "<redacted>@" in answers[3][1]
    finally:
        for r in routers:
            r.kill()
            seen.append(r.communicate()[0])
        worker.shutdown()
        worker.server_close()
    assert all(pw not in text for text in seen), [t for t in seen if pw in t]
