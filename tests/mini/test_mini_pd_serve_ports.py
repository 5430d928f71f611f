"""A PD server's two ports: `servelab serve --disaggregation-mode prefill` refuses a bootstrap
port equal to its HTTP port before loading anything, and a server that cannot bind its HTTP
port (here: its own bootstrap port holds it) fails with a one-line error and a non-zero exit
instead of printing "stopped" with exit 0, and closes its bootstrap port."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest

from servelab.errors import UserError
from servelab.mini.engine import EngineArgs
from servelab.mini.server import run_server


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
