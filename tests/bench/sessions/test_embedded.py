"""Sessions against the embedded engine (`servelab serve --config tiny --device cpu`): each
turn's prompt is the previous prompt, the answer the engine generated for it and the new text,
so later turns are longer; the engine's own prompt count of every turn equals its /tokenize
count of that transcript, so it received the earlier answers as sent. On the chat API the
history goes as messages and each turn counts more than the last plus its answer."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import aiohttp
import pytest
from serve_proc import start, wait_ready

from servelab.bench.client import Client
from servelab.bench.config import LoadPoint, SessionsConfig, ThinkTime, WorkloadConfig
from servelab.bench.datasets import build_workload
from servelab.bench.run import _remote_counter
from servelab.bench.sessions import run_sessions
from servelab.bench.sessions.driver import answer_text
from servelab.bench.workload import TURN_SEP

S, T, IN, OUT = 2, 3, 6, 5


@pytest.fixture(scope="module")
def server():
    proc, port = start("serve", "--config", "tiny", "--device", "cpu", "--context-length", "512")
    wait_ready(proc, 120)
    yield f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


def _tokenize(url: str, text: str) -> int:
    req = urllib.request.Request(url + "/tokenize", data=json.dumps({"prompt": text}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as f:
        ans = json.loads(f.read())
    return ans.get("count", len(ans.get("tokens") or []))


def _sessions(url: str, api: str):
    async def go():
        async with aiohttp.ClientSession() as http:
            count = await _remote_counter(http, url, None)
            assert count is not None
            wcfg = WorkloadConfig(input_len=IN, output_len=OUT, seed=3,
                                  sessions=SessionsConfig(num_sessions=S, turns=T))
            wl = await build_workload(wcfg, 0, count)
            client = Client(http, url, api, None, 120.0)
            return wl, *await run_sessions(wl.requests, LoadPoint(concurrency=S), api == "chat",
                                           client.send, ThinkTime(), 3)
    return asyncio.run(go())


def test_completions_turns_grow_and_carry_the_engines_answers(server):
    wl, raws, sent = _sessions(server, "completions")
    assert all(s.input_len == IN and s.input_len_exact for s in wl.requests)  # exact new text
    assert len(raws) == S * T and all(r.error is None for r in raws)
    for sid in {s.session_id for s in sent}:
        turns = sorted((s.turn, s, r) for s, r in zip(sent, raws, strict=True)
                       if s.session_id == sid)
        prev = None
        for k, spec, r in turns:
            new = next(p.prompt for p in wl.requests if (p.session_id, p.turn) == (sid, k))
            if prev is None:
                assert spec.prompt == new
            else:
                p_spec, p_raw = prev
                answer = answer_text(p_raw)
                assert answer  # the engine's own words, now part of this turn's prompt
                assert spec.prompt == p_spec.prompt + answer + TURN_SEP + new
                assert r.prompt_tokens > p_raw.prompt_tokens + IN  # longer: it carries more
                assert spec.prefix_len == p_raw.prompt_tokens
            # what the engine counted is exactly this transcript
            assert r.prompt_tokens == _tokenize(server, spec.prompt), (sid, k)
            prev = (spec, r)


def test_chat_turns_send_the_history_as_messages(server):
    _, raws, sent = _sessions(server, "chat")
    assert all(r.error is None for r in raws)
    for sid in {s.session_id for s in sent}:
        turns = sorted((s.turn, s, r) for s, r in zip(sent, raws, strict=True)
                       if s.session_id == sid)
        for (_, p_spec, p_raw), (_, spec, r) in zip(turns, turns[1:], strict=False):
            assert spec.history[-1] == ("assistant", answer_text(p_raw))
            assert spec.history[:-2] == p_spec.history
            assert r.prompt_tokens > p_raw.prompt_tokens + p_raw.completion_tokens
