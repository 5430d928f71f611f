"""The HTTP API against a real `python -m servelab serve` subprocess on loopback: OpenAI and
SGLang endpoints agree with each other and with /tokenize, usage and spec counters add up,
bad requests get 4xx and the server keeps serving, profiling writes a trace, SIGTERM is clean."""

from __future__ import annotations

import gzip
import json
import signal
import socket
import subprocess
import sys
import time
from itertools import pairwise

import pytest
from http_call import call, sse
from serve_proc import free_port, start, wait_ready


@pytest.fixture(scope="module")
def server():
    proc, port = start("serve", "--config", "tiny", "--max-running-requests", "3",
                       "--context-length", "512", "--speculative-algorithm", "EAGLE",
                       "--speculative-num-steps", "1", "--speculative-eagle-topk", "1",
                       "--speculative-num-draft-tokens", "2")
    wait_ready(proc, 90)
    yield f"http://127.0.0.1:{port}", proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n"


def test_completions_stream_and_not_agree(server):
    url, _ = server
    body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    st, full = call(url, "/v1/completions", body)
    assert st == 200 and full["usage"]["completion_tokens"] == 40
    _, tok = call(url, "/tokenize", {"prompt": PROMPT})
    assert full["usage"]["prompt_tokens"] == tok["count"] == len(PROMPT.encode()) + 1
    chunks = sse(url, "/v1/completions", {**body, "stream": True,
                                          "stream_options": {"include_usage": True}})
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == full["choices"][0]["text"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 40
    assert [c for c in chunks if c["choices"]][-1]["choices"][0]["finish_reason"] == "length"
    _, det = call(url, "/detokenize", {"tokens": tok["tokens"]})
    assert det["prompt"] == PROMPT


def test_chat_and_sglang_generate(server):
    url, _ = server
    msgs = [{"role": "user", "content": "def add(a, b):"}]
    st, full = call(url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 12,
                                                  "temperature": 0, "ignore_eos": True})
    assert st == 200 and full["usage"]["completion_tokens"] == 12
    chunks = sse(url, "/v1/chat/completions", {"messages": msgs, "max_tokens": 12,
                                               "temperature": 0, "ignore_eos": True,
                                               "stream": True})
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == full["choices"][0]["message"]["content"]
    gen = sse(url, "/generate", {"text": PROMPT, "stream": True, "sampling_params": {
        "max_new_tokens": 30, "temperature": 0, "ignore_eos": True}})
    last = gen[-1]["meta_info"]
    assert last["completion_tokens"] == 30 and last["finish_reason"]["type"] == "length"
    # cumulative text; the prefill token, then at most k + 1 = 2 tokens per verify step
    assert all(b["text"].startswith(a["text"]) for a, b in pairwise(gen))
    counts = [0] + [g["meta_info"]["completion_tokens"] for g in gen]
    assert counts[1] == 1 and all(1 <= b - a <= 2 for a, b in pairwise(counts[1:]))
    assert 1 <= last["spec_verify_ct"] <= 29 and len(gen) <= last["spec_verify_ct"] + 1


def test_metrics_and_server_info_count_speculation(server):
    url, _ = server
    _, before = call(url, "/metrics")
    st, g = call(url, "/generate", {"input_ids": [256, *b"def f(x):\n"], "sampling_params": {
        "max_new_tokens": 25, "temperature": 0, "ignore_eos": True}})
    assert st == 200
    _, after = call(url, "/metrics")

    def val(text: str, name: str) -> float:
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                   if ln.startswith(name + "{"))

    drafts = val(after, "vllm:spec_decode_num_drafts_total") - val(
        before, "vllm:spec_decode_num_drafts_total")
    acc = val(after, "vllm:spec_decode_num_accepted_tokens_total") - val(
        before, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts == g["meta_info"]["spec_verify_ct"]
    # each verify yields 1 + accepted tokens and the first came from prefill; the last verify
    # may accept up to k = 1 token past max_tokens (counted as accepted, not returned)
    assert 25 - 1 <= drafts + acc <= 25 - 1 + 1
    gen_tokens = val(after, "vllm:generation_tokens_total") - val(before,
                                                                 "vllm:generation_tokens_total")
    assert gen_tokens == 25
    _, info = call(url, "/get_server_info")
    assert info["speculative_algorithm"] == "EAGLE" and info["speculative_num_draft_tokens"] == 2
    assert info["internal_states"][0]["avg_spec_accept_length"] > 1.0
    _, models = call(url, "/v1/models")
    assert models["data"][0]["id"] == "servelab-mini-tiny"


@pytest.mark.parametrize("path,body,raw,status,word", [
    ("/v1/completions", None, b"{not json", 400, "JSON"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, None, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 600}, None, 400, "context length"),
    ("/v1/completions", {"prompt": "x" * 600}, None, 400, "context length"),
    ("/v1/completions", {"prompt": "x", "model": "gpt-9"}, None, 404, "does not exist"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, None, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, None, 400, "'max_tokens'"),
    # each of these used to kill the engine for good or answer a plain-text 500
    ("/v1/completions", None, b'{"prompt":"hi","max_tokens":4,"temperature":NaN}', 400,
     "'temperature': must be a finite number"),
    ("/v1/completions", None, b'{"prompt":"hi","max_tokens":4,"top_p":Infinity}', 400, "top_p"),
    ("/generate", None, b'{"text":"hi","sampling_params":{"temperature":NaN}}', 400,
     "sampling_params.temperature"),
    ("/v1/completions", None, b'{"prompt":"\\ud800 hi","max_tokens":2}', 400, "surrogate"),
    ("/v1/chat/completions", None,
     b'{"messages":[{"role":"user","content":"\\udfff"}],"max_tokens":2}', 400, "surrogate"),
    ("/v1/completions", {"prompt": "x", "seed": 2**70, "max_tokens": 2}, None, 400, "'seed'"),
    ("/v1/completions", {"prompt": "x", "max_tokens": True}, None, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "stop": [""]}, None, 400, "'stop'"),
    ("/v1/completions", {"prompt": "x", "min_tokens": 9, "max_tokens": 3}, None, 400,
     "min_tokens"),
    ("/v1/completions", None, b"[" * 100_000 + b"]" * 100_000, 400, "nested"),
    ("/v1/completions", None, b'{"prompt":"x","max_tokens":' + b"9" * 5000 + b"}", 400, "JSON"),
    ("/tokenize", {"prompt": 5}, None, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "model": ["a"]}, None, 400, "'model'"),  # was a 500
    ("/start_profile", {"num_steps": 0}, None, 400, "num_steps"),
    ("/v1/chat/completions", {"messages": "hi"}, None, 400, "messages"),
    ("/generate", {"sampling_params": {}}, None, 400, "text"),
    ("/detokenize", {"tokens": [1, 99999]}, None, 400, "tokens"),
])
def test_bad_requests_get_4xx_and_server_survives(server, path, body, raw, status, word):
    url, _ = server
    st, err = call(url, path, body, raw=raw)
    assert st == status and word in err["error"]["message"], err
    st, ok = call(url, "/v1/completions", {"prompt": "ok", "max_tokens": 2})
    assert st == 200 and ok["usage"]["completion_tokens"] >= 1


def test_oversized_body_is_refused_before_it_is_read(server):
    """A body above the bound gets 413 from its Content-Length (the 9 MB are never read), and
    one that lies about its length is cut off at the bound while streaming."""
    url, _ = server
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: 9437184\r\n\r\n{")
        s.settimeout(10)
        head = ""
        while "}}" not in head:  # the JSON error body ends the answer
            part = s.recv(65536).decode(errors="replace")
            if not part:
                break
            head += part
    assert head.startswith("HTTP/1.1 413") and "larger than" in head, head[:300]
    st, ok = call(url, "/v1/completions", {"prompt": "ok", "max_tokens": 2})
    assert st == 200


def test_server_info_under_both_names(server):
    """SGLang 0.5 serves /server_info (its bench reads acceptance from there) and keeps
    /get_server_info: the same body under both."""
    url, _ = server
    st1, a = call(url, "/server_info")
    st2, b = call(url, "/get_server_info")
    assert st1 == st2 == 200
    for d in (a, b):  # the lifetime stats move between the two calls; the rest must not
        d["internal_states"][0].pop("stats")
    assert a == b and a["speculative_algorithm"] == "EAGLE"


def test_metrics_tell_finished_from_aborted(server):
    """vllm:request_success_total carries vLLM's finished_reason label: a dropped stream counts
    as "abort", never as a success (it used to count in one unlabelled total)."""
    url, _ = server
    port = int(url.rsplit(":", 1)[1])

    def by_reason() -> dict[str, float]:
        out: dict[str, float] = {}
        for ln in call(url, "/metrics")[1].splitlines():
            if ln.startswith("vllm:request_success_total{"):
                reason = ln.split('finished_reason="')[1].split('"')[0]
                out[reason] = float(ln.rsplit(" ", 1)[1])
        return out

    before = by_reason()
    assert set(before) == {"stop", "length", "abort", "error"}
    st, _ = call(url, "/v1/completions", {"prompt": "a", "max_tokens": 3, "ignore_eos": True})
    assert st == 200
    body = json.dumps({"prompt": "x", "max_tokens": 400, "ignore_eos": True, "stream": True})
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                   f"application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        assert b"data:" in s.recv(4096) + s.recv(4096)
    deadline = time.time() + 20
    after = by_reason()
    while after["abort"] == before["abort"] and time.time() < deadline:
        time.sleep(0.1)
        after = by_reason()
    assert after["length"] - before["length"] == 1
    assert after["abort"] - before["abort"] == 1
    assert after["stop"] == before["stop"] and after["error"] == before["error"]


def test_profile_writes_chrome_trace(server, tmp_path):
    url, _ = server
    st, res = call(url, "/start_profile", {"output_dir": str(tmp_path), "num_steps": 3})
    assert st == 200, res
    call(url, "/v1/completions", {"prompt": "x = 1", "max_tokens": 8, "ignore_eos": True})
    deadline = time.time() + 20
    while time.time() < deadline and not list(tmp_path.glob("*.trace.json.gz")):
        time.sleep(0.1)
    files = list(tmp_path.glob("*-TP-0.trace.json.gz"))
    assert len(files) == 1
    trace = json.loads(gzip.decompress(files[0].read_bytes()))
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any(n.startswith("step[") for n in names)


def test_client_disconnect_frees_the_slot(server):
    url, _ = server
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps({"prompt": "x", "max_tokens": 400, "ignore_eos": True, "stream": True})

    def generated() -> float:
        text = call(url, "/metrics")[1]
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                   if ln.startswith("vllm:generation_tokens_total{"))

    before = generated()
    for _ in range(3):  # as many streams as slots, each dropped after its first bytes
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                       f"application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
            assert b"data:" in s.recv(4096) + s.recv(4096)
    deadline = time.time() + 20
    running = None
    while time.time() < deadline:
        _, m = call(url, "/metrics")
        running = [ln for ln in m.splitlines() if ln.startswith("vllm:num_requests_running")]
        if running and running[0].endswith(" 0.0"):
            break
        time.sleep(0.2)
    assert running and running[0].endswith(" 0.0"), running
    assert generated() - before < 3 * 400  # stopped early: the slots were freed, not run out
    st, ok = call(url, "/v1/completions", {"prompt": "ok", "max_tokens": 2})
    assert st == 200


def test_cli_errors_are_one_line(server):
    """A busy port, a missing or non-file weights path, an unknown device or log level are user
    errors: one line, exit status 2."""
    url, _ = server
    port = url.rsplit(":", 1)[1]
    for args, word in ((["--port", port], "pick another --port"),
                       (["--port", str(free_port()), "--weights", "/nonexistent.pt"], "does not exist"),
                       (["--port", str(free_port()), "--speculative-eagle-topk", "2",
                         "--speculative-algorithm", "EAGLE"], "topk"),
                       (["--port", str(free_port()), "--device", "tpu"], "cuda:N"),
                       (["--port", str(free_port()), "--log-level", "loud"], "--log-level"),
                       (["--port", str(free_port()), "--weights", "/"], "is a directory"),
                       # used to start allocating ~180 GiB of KV cache
                       (["--port", str(free_port()), "--max-running-requests", "65536",
                         "--context-length", "4000"], "KV cache"),  # ~700 GiB
                       (["--port", str(free_port()), "--seed", str(2**70)], "--seed")):  # was exit 1
        res = subprocess.run([sys.executable, "-m", "servelab", "serve", *args],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and word in lines[0], lines


def test_sigterm_exits_cleanly(server):
    _, proc = server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0

