"""The prefix cache over HTTP, against real `python -m servelab serve` subprocesses on loopback
(one with the cache, on by default, one with `--disable-radix-cache`, both speculating): cached
tokens reported as vLLM and SGLang report them (`usage.prompt_tokens_details.cached_tokens` in
completions and chat, streamed with include_usage or not; `meta_info.cached_tokens` in
/generate), greedy text the same with the cache on and off, and /metrics counting the same
tokens the answers report (servelab's and vLLM's counters, SGLang's hit rate); none of these
series on the server without the cache; a chat's second turn reuses the first one's answer."""

from __future__ import annotations

import json

import pytest
from http_call import call, sse
from serve_proc import start, wait_ready

from servelab.engines.base import parse_prometheus
from servelab.mini.model import tokenizer as tk

MTP = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1"]
SYSTEM = "# a shared system prompt\nimport os\nimport sys\n\nLIMIT = 10\n"  # 56 bytes + BOS
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def servers():
    serve = ["serve", "--config", "tiny", "--context-length", "512", "--max-running-requests",
             "2", *MTP]
    on, on_port = start(*serve)
    off, off_port = start(*serve, "--disable-radix-cache")
    try:
        wait_ready(on, 90)
        wait_ready(off, 90)
        yield f"http://127.0.0.1:{on_port}", f"http://127.0.0.1:{off_port}"
    finally:
        for p in (on, off):
            if p.poll() is None:
                p.kill()
                p.wait()


def counters(url: str) -> dict[str, float]:
    status, text = call(url, "/metrics")
    assert status == 200
    m = parse_prometheus(text)
    return {k.split("{")[0]: v for k, v in m.items() if "prefix_cache" in k or "cache_hit" in k}


def test_cached_tokens_reported_everywhere_and_the_text_unchanged(servers):
    on, off = servers
    shared = len(tk.encode(SYSTEM)) // 16 * 16  # whole blocks of the system prompt: 48
    reported = 0
    body = {"prompt": SYSTEM + "def f(x):\n    return", "max_tokens": 24, **GREEDY}
    st, first = call(on, "/v1/completions", body)
    assert st == 200 and first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    st, cold = call(off, "/v1/completions", body)
    assert cold["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert first["choices"][0]["text"] == cold["choices"][0]["text"]

    body = {**body, "prompt": SYSTEM + "class A:\n    pass\n"}
    st, warm = call(on, "/v1/completions", body)
    assert warm["usage"]["prompt_tokens_details"] == {"cached_tokens": shared}
    assert warm["choices"][0]["text"] == call(off, "/v1/completions", body)[1]["choices"][0]["text"]
    reported += shared

    chunks = sse(on, "/v1/completions", {**body, "stream": True,
                                         "stream_options": {"include_usage": True}})
    prompt_len = len(tk.encode(body["prompt"]))
    again = (prompt_len - 1) // 16 * 16  # the same prompt: all but its last token, in blocks
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": again}
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == \
        warm["choices"][0]["text"]
    reported += again

    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    chat = {"messages": msgs, "max_tokens": 8, **GREEDY}
    st, c1 = call(on, "/v1/chat/completions", chat)
    st, c2 = call(on, "/v1/chat/completions", {**chat, "stream": True,
                                               "stream_options": {"include_usage": True}})
    assert c1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # a chat template prefix
    events = [json.loads(ln[6:]) for ln in c2.split("\n") if ln.startswith("data: {")]
    got = events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert got == (c1["usage"]["prompt_tokens"] - 1) // 16 * 16 > 0
    reported += got

    gen = {"text": SYSTEM + "while True:", "sampling_params": {"max_new_tokens": 8, **GREEDY}}
    st, g = call(on, "/generate", gen)
    assert st == 200 and g["meta_info"]["cached_tokens"] == shared
    assert g["text"] == call(off, "/generate", gen)[1]["text"]
    reported += shared

    m = counters(on)
    assert m["servelab:prefix_cache_hits_total"] == m["vllm:prefix_cache_hits_total"] == reported
    assert m["servelab:prefix_cache_queries_total"] == m["vllm:prefix_cache_queries_total"]
    assert m["sglang:cache_hit_rate"] == pytest.approx(
        reported / m["servelab:prefix_cache_queries_total"])
    assert counters(off) == {}  # no cache: no series (missing, not 0)
    st, info = call(on, "/server_info")
    assert info["disable_radix_cache"] is False and info["page_size"] == 16


def test_a_chats_next_turn_reuses_the_previous_answer(servers):
    on, off = servers
    msgs = [{"role": "system", "content": SYSTEM + "# turn one\n"},
            {"role": "user", "content": "def f(x):"}]
    body = {"max_tokens": 24, **GREEDY}
    st, t1 = call(on, "/v1/chat/completions", {"messages": msgs, **body})
    assert st == 200
    answer = t1["choices"][0]["message"]["content"]
    assert answer.isascii(), "one byte per token: the answer resent is the tokens generated"
    msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": "again"}]
    st, t2 = call(on, "/v1/chat/completions", {"messages": msgs, **body})
    # turn 1's prompt and answer, in whole blocks, but its last token (never fed) and up to
    # one more (k = 1: the MTP rows of its final verify step)
    seen = t1["usage"]["prompt_tokens"] + t1["usage"]["completion_tokens"]
    cached = t2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert (seen - 2) // 16 * 16 <= cached <= seen // 16 * 16
    assert cached > t1["usage"]["prompt_tokens"]
    assert t2["choices"][0]["message"]["content"] == call(
        off, "/v1/chat/completions", {"messages": msgs, **body})[1]["choices"][0]["message"][
        "content"]
