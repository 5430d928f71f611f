"""A PD server's edges, in process or as one subprocess: `servelab serve --disaggregation-mode
prefill` refuses a bootstrap port equal to its HTTP port before loading anything; a server that
cannot bind its HTTP port (here: its own bootstrap port holds it) fails with a one-line error
and a non-zero exit instead of printing "stopped" with exit 0, and closes its bootstrap port; a
prefill request aborted by its client leaves that in its room, so its decode side fails at once.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest

from servelab.errors import UserError
from servelab.mini.engine.args import EngineArgs
from servelab.mini.server.app import run_server


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_refuses_one_port_for_http_and_bootstrap():
    port = str(_port())
    r = subprocess.run([sys.executable, "-m", "servelab", "serve", "--disaggregation-mode",
                        "prefill", "--port", port, "--disaggregation-bootstrap-port", port],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == (f"error: --disaggregation-bootstrap-port {port} is also --port: "
                                "a prefill server needs two ports")


def test_a_server_that_cannot_bind_fails_and_frees_its_bootstrap_port():
    port = _port()
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    args = EngineArgs(config="micro", random_weights=True, context_length=64,
                      max_running_requests=1, disaggregation_mode="prefill")
    try:
        with pytest.raises(UserError, match=f"cannot serve on 127.0.0.1:{port}"):
            run_server(args, "127.0.0.1", port, bootstrap_port=port)
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
    with socket.socket() as s:  # the bootstrap port was closed with the server
        s.bind(("127.0.0.1", port))


def test_a_prefill_request_aborted_by_its_client_fails_its_decode_side_at_once():
    """The prefill's client goes away before its KV is sent (here the engine is not stepping,
    so the request waits in the queue): the room says so, and the decode side's fetch fails at
    once instead of waiting out its timeout."""
    import json
    import threading
    import time
    import urllib.error
    import urllib.request

    import uvicorn

    from servelab.mini.engine.engine import Engine
    from servelab.mini.server.app import build_app
    from servelab.mini.server.pd.role import PD

    eng = Engine(EngineArgs(config="micro", random_weights=True, context_length=64,
                            max_running_requests=1))  # never started: requests stay queued
    pd = PD(eng, "prefill", "127.0.0.1", _port(), 5.0)
    pd.start()
    port = _port()
    server = uvicorn.Server(uvicorn.Config(build_app(eng, "m", {}, pd), host="127.0.0.1",
                                           port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)
        body = json.dumps({"text": "hi", "stream": True, "bootstrap_room": 9}).encode()
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            time.sleep(0.3)  # the request is queued in the engine
        t0 = time.monotonic()
        try:
            urllib.request.urlopen(
                f"http://127.0.0.1:{pd.bootstrap.port}/kv/9?timeout_s=5", timeout=10)
            raise AssertionError("the room of an aborted request served KV")
        except urllib.error.HTTPError as e:
            assert e.code == 409 and "aborted" in json.loads(e.read())["error"]
        assert time.monotonic() - t0 < 2
    finally:
        server.should_exit = True
        thread.join(10)
        pd.stop()
