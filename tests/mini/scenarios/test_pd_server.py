"""Prefill/decode disaggregation over real HTTP: `servelab serve --disaggregation-mode prefill`
and `decode` subprocesses behind `servelab router --pd-disaggregation` on loopback.

Greedy output through router -> prefill -> decode equals one engine's (with and without MTP on
decode), streaming too; /metrics on both sides count the bytes that went over the wire; a
request whose KV never comes (or whose prefill is gone) fails alone and the decode server keeps
serving. The same servers behind the real sglang_router (its PD mode) give the same output when
SERVELAB_SGLANG_ROUTER_PYTHON names an interpreter with sglang-router installed, e.g.
  python3 -m venv /tmp/sgr && /tmp/sgr/bin/pip install sglang-router==0.3.2
  SERVELAB_SGLANG_ROUTER_PYTHON=/tmp/sgr/bin/python python -m pytest tests/mini/scenarios/test_pd_server.py
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from http_call import call, sse
from serve_proc import free_port, start, wait_ready

from servelab.engines.base import parse_prometheus
from servelab.mini.engine.args import EngineArgs
from servelab.mini.engine.engine import Engine
from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.model import tokenizer as tk
from servelab.mini.model.config import TINY

MTP = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2"]
PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n"
WAIT_S = 3  # decode_plain's --disaggregation-waiting-timeout


@pytest.fixture(scope="module")
def pd():
    boot = free_port()
    serve = ["serve", "--config", "tiny", "--context-length", "512"]
    prefill, p_port = start(*serve, *MTP, "--disaggregation-mode", "prefill",
                             "--disaggregation-bootstrap-port", str(boot))
    dec_mtp, dm_port = start(*serve, *MTP, "--disaggregation-mode", "decode")
    dec_plain, dp_port = start(*serve, "--disaggregation-mode", "decode",
                                "--disaggregation-waiting-timeout", str(WAIT_S))
    procs = [prefill, dec_mtp, dec_plain]
    try:
        for p in procs:
            wait_ready(p)
        pre = f"http://127.0.0.1:{p_port}"
        r_mtp, rm_port = start("router", "--pd-disaggregation", "--prefill", pre, str(boot),
                                "--decode", f"http://127.0.0.1:{dm_port}")
        r_plain, rp_port = start("router", "--pd-disaggregation", "--prefill", pre, str(boot),
                                  "--decode", f"http://127.0.0.1:{dp_port}",
                                  "--policy", "random")
        procs += [r_mtp, r_plain]
        wait_ready(r_mtp)
        wait_ready(r_plain)
        yield {"prefill": pre, "prefill_proc": prefill, "boot": boot,
               "decode_mtp": f"http://127.0.0.1:{dm_port}",
               "decode_plain": f"http://127.0.0.1:{dp_port}",
               "router_mtp": f"http://127.0.0.1:{rm_port}",
               "router_plain": f"http://127.0.0.1:{rp_port}"}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def reference():
    """The same model in one engine, in this process: what PD must reproduce."""
    eng = Engine(EngineArgs(config="tiny", context_length=512))

    def greedy(prompt: str, n: int) -> str:
        return eng.generate(tk.encode(prompt), SamplingParams(max_tokens=n, temperature=0.0,
                                                              ignore_eos=True))[1]
    return greedy


def metrics(url: str) -> dict[str, float]:
    status, text = call(url, "/metrics")
    assert status == 200
    return parse_prometheus(text)


def _sum(m: dict[str, float], name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in m.items() if k.split("{")[0] == name and all(w in k for w in want))


GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.mark.parametrize("router", ["router_mtp", "router_plain"])
def test_greedy_through_pd_equals_one_engine(pd, reference, router):
    url = pd[router]
    want = reference(PROMPT, 40)
    st, full = call(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 40, **GREEDY})
    assert st == 200, full
    assert full["choices"][0]["text"] == want
    n = len(tk.encode(PROMPT))
    # the prefill server's prefix cache: the prompt seen before (the other router, or the
    # stream below) is reused in whole 16-token blocks but its last token
    reused = (n - 1) // 16 * 16
    cached = full["usage"].pop("prompt_tokens_details")["cached_tokens"]
    assert cached in (0, reused)
    assert full["usage"] == {"prompt_tokens": n, "completion_tokens": 40, "total_tokens": n + 40}
    chunks = sse(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 40, "stream": True,
                                          "stream_options": {"include_usage": True}, **GREEDY})
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == want
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": reused}
    st, gen = call(url, "/generate", {"text": PROMPT, "sampling_params": {
        "max_new_tokens": 40, "temperature": 0, "ignore_eos": True}})
    assert st == 200 and gen["text"] == want and gen["meta_info"]["cached_tokens"] == reused
    if router == "router_mtp":  # the decode server speculated: fewer verify steps than tokens
        assert 0 < gen["meta_info"]["spec_verify_ct"] < 39
        # /server_info through the router is the decode server's (acceptance shows)
        st, info = call(url, "/server_info")
        assert info["disaggregation_mode"] == "decode"
        assert info["internal_states"][0]["avg_spec_accept_length"] > 1.0
        assert info["router"]["prefill"] == [[pd["prefill"], pd["boot"]]]
    chat = sse(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                             "max_tokens": 12, "stream": True, **GREEDY})
    assert chat[-1]["choices"][0]["finish_reason"] == "length"


def test_transfer_counters_count_the_bytes_sent(pd):
    before_p, before_d = metrics(pd["prefill"]), metrics(pd["decode_mtp"])
    n = 3
    for i in range(n):
        st, _ = call(pd["router_mtp"], "/v1/completions",
                     {"prompt": PROMPT * (i + 1), "max_tokens": 4, **GREEDY})
        assert st == 200
    after_p, after_d = metrics(pd["prefill"]), metrics(pd["decode_mtp"])

    def d(b, a, name, **lab):
        return _sum(a, name, **lab) - _sum(b, name, **lab)

    sent = d(before_p, after_p, "servelab:kv_transfer_bytes_total", direction="sent")
    got = d(before_d, after_d, "servelab:kv_transfer_bytes_total", direction="received")
    assert sent == got > 0
    # the bytes are the KV: (4 layers + the MTP layer) x prompt rows x (latent + indexer) x fp32,
    # plus a header of at most a few KB per transfer
    cfg = TINY
    rows = sum(len(tk.encode(PROMPT * (i + 1))) for i in range(n))
    kv = (cfg.n_layers + 1) * rows * (cfg.kv_dim + cfg.index_dim) * 4
    assert kv < sent < kv + n * 4096
    assert d(before_p, after_p, "servelab:kv_transfers_total", direction="sent",
             outcome="ok") == n
    assert d(before_d, after_d, "servelab:kv_transfers_total", direction="received",
             outcome="ok") == n
    assert d(before_d, after_d, "servelab:kv_transfer_seconds_total") > 0
    # through the router, the decode worker's counters are visible (labelled by worker)
    routed = metrics(pd["router_mtp"])
    assert _sum(routed, "servelab:kv_transfer_bytes_total") == _sum(
        after_d, "servelab:kv_transfer_bytes_total")
    assert _sum(routed, "vllm:spec_decode_num_drafts_total") > 0
    # and the prefill worker's prefix cache (PROMPT * 2 and * 3 reuse PROMPT's whole blocks)
    assert _sum(routed, "servelab:prefix_cache_hits_total", worker=pd["prefill"]) == _sum(
        after_p, "servelab:prefix_cache_hits_total") > 0
    assert _sum(routed, "vllm:prompt_tokens_total") == _sum(after_d, "vllm:prompt_tokens_total")
    assert _sum(routed, "servelab:router_requests_total", path="/v1/completions",
                code="200") >= n


def test_kv_that_never_comes_fails_that_request_alone(pd):
    dec = pd["decode_plain"]
    body = {"prompt": PROMPT, "max_tokens": 4, **GREEDY, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": pd["boot"], "bootstrap_room": 12345}
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        stuck = pool.submit(call, dec, "/v1/completions", body)
        # while that request waits for its KV, the same decode server serves routed requests
        st, full = call(pd["router_plain"], "/v1/completions",
                        {"prompt": PROMPT, "max_tokens": 8, **GREEDY})
        assert st == 200 and full["usage"]["completion_tokens"] == 8, full
        assert not stuck.done() and time.monotonic() - t0 < WAIT_S
        st, err = stuck.result()
    assert st == 504 and "did not arrive" in err["error"]["message"], err
    assert WAIT_S <= time.monotonic() - t0 < WAIT_S + 5
    st, err = call(dec, "/v1/completions", {**body, "bootstrap_port": free_port()})  # nobody there
    assert st == 502 and "cannot be reached" in err["error"]["message"], err
    http_port = int(pd["prefill"].rsplit(":", 1)[1])  # the prefill's HTTP port, not its bootstrap
    st, err = call(dec, "/v1/completions", {**body, "bootstrap_port": http_port})
    assert st == 502 and "is not a prefill server's bootstrap port" in err["error"]["message"]
    st, err = call(dec, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4})
    assert st == 400 and "bootstrap_room" in err["error"]["message"]
    assert call(dec, "/health")[0] == 200
    m = metrics(dec)
    assert _sum(m, "servelab:kv_transfers_total", outcome="timeout") >= 1
    assert _sum(m, "servelab:kv_transfers_total", outcome="unreachable") >= 1
    st, full = call(pd["router_plain"], "/v1/completions",
                    {"prompt": PROMPT, "max_tokens": 8, **GREEDY})
    assert st == 200 and full["usage"]["completion_tokens"] == 8


def test_the_bootstrap_port_refuses_bad_rooms_and_timeouts_at_once(pd):
    """`timeout_s=nan` used to park the long poll forever."""
    boot = f"http://127.0.0.1:{pd['boot']}"
    for q in ("/kv/1?timeout_s=nan", "/kv/1?timeout_s=-1", "/kv/1?timeout_s=x", "/kv/-5",
              f"/kv/{2**64}", "/kv/1e3"):
        st, err = call(boot, q, timeout=10)
        assert st == 400 and "ROOM an integer" in err["error"], (q, err)


def _hostile_bootstrap(family: int, host: str):
    """A bootstrap port that answers every fetch with more bytes than any handoff: room 1 says
    so in its Content-Length, room 2 streams 64 MB without one."""
    import http.server
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            if "/kv/1?" in self.path:
                self.send_header("Content-Length", str(10**12))
            self.end_headers()
            try:
                for _ in range(64):
                    self.wfile.write(b"\0" * (1 << 20))
            except OSError:
                pass

        def log_message(self, *_args) -> None:
            pass

    class S(http.server.ThreadingHTTPServer):
        address_family = family

    srv = S((host, 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_hostile_bootstrap_port_cannot_fill_the_decode_servers_memory(pd, host):
    srv = _hostile_bootstrap(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    try:
        for room in (1, 2):
            body = {"prompt": PROMPT, "max_tokens": 4, "bootstrap_host": host,
                    "bootstrap_port": srv.server_address[1], "bootstrap_room": room}
            st, err = call(pd["decode_plain"], "/v1/completions", body, timeout=30)
            assert st == 502 and "more than the" in err["error"]["message"], err
    finally:
        srv.shutdown()
        srv.server_close()
    assert call(pd["decode_plain"], "/health")[0] == 200


def test_a_bootstrap_host_cannot_rewrite_the_url_decode_fetches(pd):
    for host in ("127.0.0.1:1/health#", "a@b", "x/y", "", " ", "[::1", 7):
        body = {"prompt": PROMPT, "max_tokens": 4, "bootstrap_host": host,
                "bootstrap_port": pd["boot"], "bootstrap_room": 3}
        st, err = call(pd["decode_plain"], "/v1/completions", body)
        assert st == 400 and err["error"]["param"] == "bootstrap_host", (host, err)


def test_a_refused_prefill_fails_its_decode_side_at_once(pd):
    st, err = call(pd["router_plain"], "/v1/completions",
                   {"prompt": PROMPT, "max_tokens": 4, "temperature": -1})
    assert st == 400 and "temperature" in err["error"]["message"]
    st, err = call(pd["prefill"], "/v1/completions", {"prompt": PROMPT, "max_tokens": 4})
    assert st == 400 and "PD router" in err["error"]["message"]
    # the prefill refuses a request of room 99; the decode side of room 99 hears why at once
    boot = {"bootstrap_host": "127.0.0.1", "bootstrap_port": pd["boot"], "bootstrap_room": 99}
    st, _ = call(pd["prefill"], "/v1/completions", {"prompt": PROMPT, "max_tokens": 4,
                                                    "top_p": 7, **boot})
    assert st == 400
    t0 = time.monotonic()
    st, err = call(pd["decode_plain"], "/v1/completions", {"prompt": PROMPT, "max_tokens": 4,
                                                          **boot})
    assert st == 502 and "failed bootstrap_room 99" in err["error"]["message"]
    assert "top_p" in err["error"]["message"]
    assert time.monotonic() - t0 < WAIT_S
    m = metrics(pd["decode_plain"])
    assert _sum(m, "servelab:kv_transfers_total", outcome="prefill_failed") >= 1


def test_router_answers_hostile_bodies_with_json_400s(pd):
    url = pd["router_plain"]
    for raw, why in ((b"[" * 100000 + b"]" * 100000, "nested too deeply"),
                     (b'{"prompt": "\xff"}', "not valid JSON"), (b"[1]", "JSON object")):
        req = urllib.request.Request(url + "/v1/completions", data=raw, method="POST")
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(req, timeout=30)
        err = json.loads(ei.value.read())["error"]
        assert ei.value.code == 400 and why in err["message"], err
        assert err["type"] == "invalid_request_error"


def test_a_hanging_prefill_does_not_hold_a_request_the_decode_failed(pd):
    """The decode server fails the request at once (nothing on the bootstrap port); the router
    answers with that failure instead of waiting for a prefill that never answers."""
    import threading

    lsn = socket.socket()
    lsn.bind(("127.0.0.1", 0))
    lsn.listen(16)  # accepts connections and never answers
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(lsn.accept()[0]), daemon=True).start()
    router, port = start("router", "--pd-disaggregation", "--prefill",
                          f"http://127.0.0.1:{lsn.getsockname()[1]}", str(free_port()),
                          "--decode", pd["decode_plain"])
    try:
        wait_ready(router)
        t0 = time.monotonic()
        st, err = call(f"http://127.0.0.1:{port}", "/v1/completions",
                       {"prompt": PROMPT, "max_tokens": 4}, timeout=20)
        assert st == 502 and "cannot be reached" in err["error"]["message"], err
        assert time.monotonic() - t0 < 10
    finally:
        router.kill()
        router.wait()
        lsn.close()
        for c in held:
            c.close()


def test_the_real_sglang_router_fronts_these_servers(pd, reference):
    py = os.environ.get("SERVELAB_SGLANG_ROUTER_PYTHON")
    if not py:
        pytest.skip("no interpreter with sglang-router: set SERVELAB_SGLANG_ROUTER_PYTHON "
                    "(this module's docstring)")
    port = free_port()
    proc = subprocess.Popen([py, "-m", "sglang_router.launch_router", "--pd-disaggregation",
                             "--prefill", pd["prefill"], str(pd["boot"]), "--decode",
                             pd["decode_mtp"], "--host", "127.0.0.1", "--port", str(port),
                             "--policy", "round_robin"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if call(url, "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        want = reference(PROMPT, 30)
        body = {"model": "servelab-mini-tiny", "prompt": PROMPT, "max_tokens": 30, **GREEDY}
        st, full = call(url, "/v1/completions", body)
        assert st == 200 and full["choices"][0]["text"] == want, full
        chunks = sse(url, "/v1/completions", {**body, "stream": True})
        assert "".join(c["choices"][0]["text"] for c in chunks) == want
        st, gen = call(url, "/generate", {"text": PROMPT, "sampling_params": {
            "max_new_tokens": 30, "temperature": 0, "ignore_eos": True}})
        assert st == 200 and gen["text"] == want
    finally:
        proc.kill()
        proc.wait()


def test_a_router_with_its_workers_swapped_is_not_healthy(pd):
    """A prefill server named as --decode would answer every request with one token."""
    router, port = start("router", "--pd-disaggregation", "--prefill", pd["decode_plain"],
                          "--decode", pd["prefill"])
    try:
        wait_ready(router)
        st, err = call(f"http://127.0.0.1:{port}", "/health")
        assert st == 503, err
        assert (f"{pd['prefill']} runs --disaggregation-mode prefill, routed as decode"
                in err["error"]["message"])
        assert call(pd["router_plain"], "/health")[0] == 200
        # before: a request went through and came back with one token, finish_reason "length"
        st, err = call(f"http://127.0.0.1:{port}", "/v1/completions",
                       {"prompt": PROMPT, "max_tokens": 8})
        assert st == 503 and "routed as" in err["error"]["message"], err
    finally:
        router.kill()
        router.wait()


def test_a_dead_prefill_fails_requests_cleanly(pd):
    """Last in the module: it kills the prefill server."""
    pd["prefill_proc"].kill()
    pd["prefill_proc"].wait()
    st, err = call(pd["router_mtp"], "/v1/completions", {"prompt": PROMPT, "max_tokens": 4})
    assert st == 502 and "prefill" in err["error"]["message"], err
    body = {"prompt": PROMPT, "max_tokens": 4, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": pd["boot"], "bootstrap_room": 7}
    st, err = call(pd["decode_mtp"], "/v1/completions", body)
    assert st == 502 and "cannot be reached" in err["error"]["message"], err
    assert call(pd["decode_mtp"], "/health")[0] == 200
    assert call(pd["router_mtp"], "/health")[0] == 503
