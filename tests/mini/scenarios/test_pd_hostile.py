"""The PD path against hostile clients and hostile bootstrap ports, over real HTTP: `servelab
serve` prefill and decode subprocesses behind `servelab router --pd-disaggregation` on loopback.

A client names the host a decode server fetches KV from (`bootstrap_host`): outside the
decode server's allow-list that is a 400 and no connection is made there; inside it, the fetch
follows no redirect and relays no body that is not the bootstrap server's own answer (nor any
control character); a header whose sizes torch cannot allocate is a 502, not a 500; handoffs
whose sampler state is invalid fail alone (the good requests of the same steps complete and
/health stays 200); 1,100 polls aimed at a silent bootstrap port do not delay a legitimate
request to a real one, and the ones that wait are counted.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from mini_pd import prefill
from serve_proc import free_port, start, wait_ready

from servelab.engines.base import parse_prometheus
from servelab.mini.engine.args import EngineArgs
from servelab.mini.engine.engine import Engine
from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.model import tokenizer as tk

PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n"
WAIT_S = 60  # the decode servers' --disaggregation-waiting-timeout: longer than any test here


@pytest.fixture(scope="module")
def pd():
    boot = free_port()
    serve = ["serve", "--config", "tiny", "--context-length", "512"]
    pre, p_port = start(*serve, "--disaggregation-mode", "prefill",
                        "--disaggregation-bootstrap-port", str(boot))
    dec, d_port = start(*serve, "--disaggregation-mode", "decode",
                        "--disaggregation-waiting-timeout", str(WAIT_S))
    wide, w_port = start(*serve, "--disaggregation-mode", "decode",
                         "--disaggregation-waiting-timeout", str(WAIT_S),
                         "--disaggregation-allowed-bootstrap-hosts", "127.0.0.2,10.0.0.0/8")
    procs = [pre, dec, wide]
    try:
        for p in procs:
            wait_ready(p)
        router, r_port = start("router", "--pd-disaggregation", "--prefill",
                               f"http://127.0.0.1:{p_port}", str(boot),
                               "--decode", f"http://127.0.0.1:{d_port}")
        procs.append(router)
        wait_ready(router)
        yield {"boot": boot, "decode": f"http://127.0.0.1:{d_port}",
               "wide": f"http://127.0.0.1:{w_port}", "router": f"http://127.0.0.1:{r_port}"}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def call(url: str, path: str, body: dict | None = None, timeout: float = 60):
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method="POST" if data else "GET",
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


def metric(url: str, name: str) -> float:
    st, text = call(url, "/metrics")
    assert st == 200
    return sum(v for k, v in parse_prometheus(text).items() if k.split("{")[0] == name)


class Listener:
    """A TCP listener on `host` that counts the connections it gets and answers each with
    `answer(request line)` (None: hold the connection open, never answer)."""

    def __init__(self, host: str, answer=None) -> None:
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.answer, self.connections, self.held = answer, 0, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            line = conn.recv(65536).split(b"\r\n", 1)[0].decode(errors="replace")
            if self.answer is None:
                self.held.append(conn.dup())
                return
            conn.sendall(self.answer(line))

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


def _http(status: str, body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return (f"HTTP/1.1 {status}\r\n{head}Content-Length: {len(body)}\r\nConnection: close"
            f"\r\n\r\n").encode() + body


def _body(room: int, **extra) -> dict:
    return {"prompt": PROMPT, "max_tokens": 4, "bootstrap_room": room, **extra}


def test_a_bootstrap_host_outside_the_allow_list_is_refused_and_never_contacted(pd):
    """127.0.0.2 is loopback but not 127.0.0.1: outside the default allow-list (loopback's
    127.0.0.1/::1/localhost and this machine's addresses). The decode server used to fetch from
    any host a client named (a server-side request forgery)."""
    lsn = Listener("127.0.0.2", lambda _line: _http("500 Oops", b"internal secret"))
    try:
        for host in ("127.0.0.2", "169.254.169.254", "example.com", "10.1.2.3"):
            st, err = call(pd["decode"], "/v1/completions",
                           _body(5, bootstrap_host=host, bootstrap_port=lsn.port))
            assert st == 400 and err["error"]["param"] == "bootstrap_host", (host, err)
            assert "no request was made" in err["error"]["message"]
            assert "\n" not in err["error"]["message"]
        time.sleep(0.5)
        assert lsn.connections == 0
        # --disaggregation-allowed-bootstrap-hosts widens it: the same request is made there
        st, err = call(pd["wide"], "/v1/completions",
                       _body(5, bootstrap_host="127.0.0.2", bootstrap_port=lsn.port))
        assert st == 502 and lsn.connections == 1, err
        assert "secret" not in err["error"]["message"]
    finally:
        lsn.close()
    assert call(pd["decode"], "/health")[0] == 200


def _bad_sizes() -> bytes:
    """A handoff header with kv_shape [0, 1, 2^63] and zero bytes: consistent, unallocatable."""
    head = json.dumps({"version": 1, "room": 4, "prompt": [1], "first_token": 1, "drafts": [],
                       "dtype": "float32", "kv_shape": [0, 1, 2**63], "ik_shape": [0, 1, 2**63],
                       "fingerprint": "x", "bytes": [0, 0, 0]}).encode()
    return b"SLKV" + struct.pack(">I", len(head)) + head


def test_a_hostile_bootstrap_port_gets_no_redirect_no_relay_and_no_500(pd):
    canary = Listener("127.0.0.1", lambda _line: _http("200 OK", b"{}"))
    evil = b"SECRET \x1b]0;pwned\x07\x1b[31m\nX-Injected: 1\r\n\x00"

    def answer(line: str) -> bytes:
        room = line.split("/kv/")[1].split("?")[0]
        return {
            "1": _http("302 Found", b"", f"Location: http://127.0.0.1:{canary.port}/secret"),
            "2": _http("500 Internal", evil, "Content-Type: text/plain"),
            "3": _http("409 Conflict", json.dumps({"error": evil.decode()}).encode(),
                       "X-Servelab-Bootstrap: 1", "Content-Type: application/json"),
            "4": _http("200 OK", _bad_sizes(), "Content-Type: application/octet-stream"),
        }[room]

    srv = Listener("127.0.0.1", answer)
    try:
        msgs = {}
        for room in (1, 2, 3, 4):
            st, err = call(pd["decode"], "/v1/completions",
                           _body(room, bootstrap_host="127.0.0.1", bootstrap_port=srv.port))
            assert st == 502, (room, st, err)
            msgs[room] = m = err["error"]["message"]
            assert not any(c in m for c in "\x1b\x07\n\r\x00"), (room, m)
        assert canary.connections == 0, "the fetch followed a redirect"
        assert "HTTP 302" in msgs[1] and "HTTP 500" in msgs[2]
        assert "SECRET" not in msgs[1] + msgs[2]  # a body not of our protocol is never shown
        assert "SECRET" in msgs[3] and "pwned" in msgs[3]  # ours is, on one printable line
        assert "malformed" in msgs[4] and "2^24" not in msgs[4]
    finally:
        srv.close()
        canary.close()
    assert call(pd["decode"], "/health")[0] == 200


@pytest.fixture(scope="module")
def tiny():
    return Engine(EngineArgs(config="tiny", context_length=512, max_running_requests=2))


def test_bad_handoffs_fail_alone_and_health_stays_200(pd, tiny):
    """Handoffs for this model and prompt whose sampler state is 5,056 valid-length bytes
    torch refuses: they used to pass the check and fail inside the engine step (with the good
    requests installed in it); three in a row turned /health to 503."""
    prompt = tk.encode(PROMPT)
    sp = SamplingParams(max_tokens=4, temperature=0.8, seed=1)
    wire, _ = prefill(tiny, prompt, sp, room=0)
    (n,) = struct.unpack(">I", wire[4:8])
    head = json.loads(wire[8:8 + n])
    ngen = head["bytes"][2]
    assert ngen == 5056

    def answer(_line: str) -> bytes:
        return _http("200 OK", wire[:-ngen] + os.urandom(ngen),
                     "Content-Type: application/octet-stream")

    srv = Listener("127.0.0.1", answer)
    bad = _body(0, bootstrap_host="127.0.0.1", bootstrap_port=srv.port, temperature=0.8)
    try:
        answers = [call(pd["decode"], "/v1/completions", bad) for _ in range(3)]  # 3 steps
        assert call(pd["decode"], "/health")[0] == 200
        assert call(pd["router"], "/health")[0] == 200
        for st, err in answers:
            assert st == 502 and "sampler state" in err["error"]["message"], err
        good = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0.8, "ignore_eos": True}
        with ThreadPoolExecutor(12) as pool:
            goods = [pool.submit(call, pd["router"], "/v1/completions", good) for _ in range(6)]
            bads = [pool.submit(call, pd["decode"], "/v1/completions", bad) for _ in range(6)]
            for f in goods:
                st, full = f.result()
                assert st == 200 and full["usage"]["completion_tokens"] == 24, full
            assert all(f.result()[0] == 502 for f in bads)
    finally:
        srv.close()
    assert call(pd["decode"], "/health")[0] == 200


@pytest.mark.parametrize("target", ["silent port", "real prefill"])
def test_a_flood_of_polls_does_not_delay_a_legitimate_request(pd, target):
    """1,100 requests whose KV never comes: from this client (127.0.0.1, the router's address
    too) to a bootstrap port that never answers, or from another client (127.0.0.2) for
    unknown rooms of the real prefill. They held the decode server's one pool of 1,024
    connections, and a legitimate request then waited for one. Fetches are limited per
    prefill and per client within one now; those that wait are counted."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4096)  # accepts nothing: every fetch to it waits (for WAIT_S)
    if target == "silent port":
        aim, source = silent.getsockname()[1], "127.0.0.1"
    else:
        aim, source = pd["boot"], "127.0.0.2"
    port = int(pd["decode"].rsplit(":", 1)[1])
    flood = []
    try:
        for i in range(1100):
            body = json.dumps(_body(10**9 + i, bootstrap_host="127.0.0.1",
                                    bootstrap_port=aim)).encode()
            c = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: " + str(len(body)).encode()
                      + b"\r\n\r\n" + body)
            flood.append(c)
        deadline = time.monotonic() + 10  # until the decode server has read them all
        while (metric(pd["decode"], "servelab:kv_fetches_queued") < 1100 - 512
               and time.monotonic() < deadline):
            time.sleep(0.2)
        t0 = time.monotonic()
        st, full = call(pd["router"], "/v1/completions",
                        {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}, timeout=WAIT_S)
        assert st == 200 and full["usage"]["completion_tokens"] == 8, full
        assert time.monotonic() - t0 < 5
        assert metric(pd["decode"], "servelab:kv_fetches_queued") == 1100 - 512
        assert metric(pd["decode"], "servelab:kv_fetch_queued_total") >= 1100 - 512
    finally:
        for c in flood:
            c.close()
        silent.close()
    # the flood's clients went away: their fetches and queue places are given up
    deadline = time.monotonic() + 20
    while (metric(pd["decode"], "servelab:kv_fetches_queued") > 0
           and time.monotonic() < deadline):
        time.sleep(0.2)
    assert metric(pd["decode"], "servelab:kv_fetches_queued") == 0
    boot = f"http://127.0.0.1:{pd['boot']}"
    while call(boot, "/route")[1]["polls_waiting"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert call(boot, "/route")[1]["polls_waiting"] == 0  # and the prefill's long polls
    assert call(pd["decode"], "/health")[0] == 200
