"""A real `servelab serve` subprocess on loopback and clients that go away, or ask for sampling
parameters at the edge of what float32 computes.

Non-streaming requests whose client closed its socket used to run to their last token (8 x
1,000 tokens for nobody, their slots held); they are aborted now, well before they would have
finished, and the server's own counters say so. `temperature 1e-40` and `top_p 1e-300`, which
the API allows, gave a 500 from a float32 underflow; they are answered now.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest
from serve_proc import start, wait_ready

from servelab.engines.base import parse_prometheus

MAX_TOKENS = 1000


@pytest.fixture(scope="module")
def server():
    proc, port = start("serve", "--config", "tiny", "--context-length", "1100",
                       "--max-running-requests", "8")
    wait_ready(proc, 90)
    yield port
    proc.kill()
    proc.wait()


def call(port: int, path: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 method="POST" if data else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def counters(port: int) -> dict[str, float]:
    st, text = call(port, "/metrics")
    assert st == 200
    out: dict[str, float] = {}
    for k, v in parse_prometheus(text).items():
        name = k.split("{")[0]
        if name == "vllm:request_success_total":
            name += "/" + k.split('finished_reason="')[1].split('"')[0]
        out[name] = out.get(name, 0.0) + v
    return out


def _post(port: int, path: str, body: dict) -> socket.socket:
    raw = json.dumps(body).encode()
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
    return c


def test_non_streaming_requests_are_aborted_when_their_client_goes_away(server):
    long = {"max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}
    bodies = [("/v1/completions", {"prompt": "def f(x):", **long})] * 3 + [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], **long})] * 3 + [
        ("/generate", {"text": "import os", "sampling_params": {
            "max_new_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}})] * 2
    before = counters(server)
    socks = [_post(server, path, body) for path, body in bodies]
    try:
        deadline = time.monotonic() + 30
        while (counters(server)["vllm:num_requests_running"] < 8
               and time.monotonic() < deadline):
            time.sleep(0.05)
        assert counters(server)["vllm:num_requests_running"] == 8
    finally:
        for c in socks:
            c.close()  # the clients go away, their answers unread
    t0 = time.monotonic()
    while counters(server)["vllm:num_requests_running"] and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    after = counters(server)
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:request_success_total/abort"] - before["vllm:request_success_total/abort"] == 8
    produced = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert produced < 8 * MAX_TOKENS / 4, produced  # aborted well before their end
    st, full = call(server, "/v1/completions", {"prompt": "x", "max_tokens": 4})
    assert st == 200 and full["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("sampling", [{"temperature": 1e-40}, {"top_p": 1e-300},
                                      {"temperature": 1e-40, "top_p": 1e-300},
                                      {"temperature": 1e-5, "top_p": 5e-324}])
def test_sampling_parameters_at_float32s_edge_are_answered(server, sampling):
    st, full = call(server, "/v1/completions", {"prompt": "def f(x):", "max_tokens": 8,
                                                "ignore_eos": True, **sampling})
    assert st == 200 and full["usage"]["completion_tokens"] == 8, full
    st, gen = call(server, "/generate", {"text": "def f(x):", "sampling_params": {
        "max_new_tokens": 8, "ignore_eos": True, **sampling}})
    assert st == 200 and gen["meta_info"]["completion_tokens"] == 8, gen
