"""The SGLang adapter: its server and router command lines (PD roles, a venv or container
launcher) and how it reads a server's description (/server_info, then /get_server_info)."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from servelab import engines
from servelab.engines.base import (
    ProcessConfig,
    ProcessPlan,
)
from servelab.engines.launcher import Launcher


def test_sglang_server_and_router_commands():
    sg = engines.get("sglang")
    cfg = ProcessConfig(role="decode", flags={"tp-size": 4}, port=31000)
    argv = sg.command(cfg, "org/Model", {})
    # never servelab's own interpreter: python3 on PATH unless the file names the engine's
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"] and sys.executable not in argv
    venv = Launcher(python="/opt/sgl/bin/python", container=("docker", "exec", "-i", "c"))
    assert sg.command(replace(cfg, launcher=venv), "org/Model", {})[:6] == [
        "docker", "exec", "-i", "c", "/opt/sgl/bin/python", "-m"]
    assert sg.port_flags("prefill") == ("nccl-port", "engine-info-bootstrap-port",
                                        "disaggregation-bootstrap-port")
    assert argv[3:] == [
        "--model-path",
        "org/Model",
        "--host",
        "127.0.0.1",
        "--port",
        "31000",
        "--disaggregation-mode",
        "decode",
        "--tp-size",
        "4",
    ]
    pre = ProcessPlan("prefill", [], {}, "127.0.0.1", 31001, "", "http://127.0.0.1:31001")
    dec = ProcessPlan("decode", [], {}, "127.0.0.1", 31000, "", "http://127.0.0.1:31000")
    router = ProcessConfig(
        role="router",
        flags={"policy": "round_robin"},
        port=30000,
        extra={"bootstrap_port:31001": 8998},
    )
    r = sg.command(router, "org/Model", {"prefill0": pre, "decode1": dec})
    assert r[1:] == [
        "-m",
        "sglang_router.launch_router",
        "--pd-disaggregation",
        "--prefill",
        "http://127.0.0.1:31001",
        "8998",
        "--decode",
        "http://127.0.0.1:31000",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
        "--policy",
        "round_robin",
    ]


@pytest.mark.parametrize(
    ("served", "want_hits"),
    [
        ({"/server_info": b'{"tp_size": 8}'}, ["/server_info"]),  # current SGLang
        ({"/get_server_info": b'{"tp_size": 8}'}, ["/server_info", "/get_server_info"]),  # older
    ],
)
def test_sglang_info_prefers_server_info_and_falls_back(served, want_hits):
    """SGLang's /get_server_info is a deprecated alias (it logs a warning per call) of
    /server_info; older versions have only the alias."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            hits.append(self.path)
            body = served.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        got = engines.get("sglang").info(f"http://127.0.0.1:{srv.server_port}")
    finally:
        srv.shutdown()
        srv.server_close()
    assert got == {"tp_size": 8} and hits == want_hits
