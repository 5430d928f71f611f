"""The scripted server itself: its command line (ready line, SIGTERM), its wire formats, its
schedule, and the client's request shape (ignore_eos reaches the server)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request

import pytest

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.run import run_load_point
from servelab.bench.scripted.harness import script_argv, serve_in_thread
from servelab.bench.scripted.script import Script


def post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as f:
            return f.status, f.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_command_line_ready_line_and_sigterm():
    argv = script_argv(Script(ttft_ms=1, gap_ms=1, tokens_per_chunk=2, model="m1"))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("scripted-server ready http://127.0.0.1:")
        url = line.split()[-1]
        with urllib.request.urlopen(url + "/health", timeout=10) as f:
            assert f.read() == b"ok"
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as f:
            assert json.loads(f.read())["data"][0]["id"] == "m1"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_bad_command_line_is_rejected():
    r = subprocess.run([sys.executable, "-m", "servelab.bench.scripted", "--fail-modes",
                        "explode"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "unknown failure mode" in r.stderr


def test_wire_formats_and_schedule():
    with serve_in_thread(Script(ttft_ms=5, gap_ms=3, tokens_per_chunk=2)) as h:
        code, body = post(h.url + "/v1/completions", {"prompt": "a b c", "max_tokens": 5,
                                                      "stream": True,
                                                      "stream_options": {"include_usage": True}})
        assert code == 200
        lines = [ln for ln in body.decode().split("\n") if ln]
        assert lines[-1] == "data: [DONE]"
        objs = [json.loads(ln[6:]) for ln in lines[:-1]]
        assert [o["choices"][0]["text"] for o in objs[:-1]] == [" tok", " tok tok", " tok tok"]
        assert objs[-1]["choices"] == [] and objs[-1]["usage"]["completion_tokens"] == 5
        assert objs[-1]["usage"]["prompt_tokens"] == 3
        code, body = post(h.url + "/v1/chat/completions", {"messages": [
            {"role": "user", "content": "x y"}], "max_tokens": 3})
        ans = json.loads(body)
        assert ans["choices"][0]["message"]["content"] == " tok tok tok"
        assert ans["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
        code, body = post(h.url + "/generate", {"text": "q", "stream": False,
                                                "sampling_params": {"max_new_tokens": 7}})
        meta = json.loads(body)["meta_info"]
        assert meta["completion_tokens"] == 7 and meta["spec_verify_ct"] == 3  # 1 + 2 + 2 + 2
        code, body = post(h.url + "/tokenize", {"prompt": "one two three four"})
        assert json.loads(body)["count"] == 4
        log = h.log()
    first = log[0]
    assert first["chunk_tokens"] == [1, 2, 2]
    # the schedule: first chunk ttft after arrival, then one chunk per gap (absolute times)
    assert (first["send_ns"][0] - first["arrival_ns"]) / 1e6 >= 5
    assert (first["send_ns"][2] - first["arrival_ns"]) / 1e6 >= 5 + 2 * 3


def test_client_asks_for_a_fixed_length_and_the_server_honours_it():
    """natural_len=3: a request without ignore_eos/min_tokens would stop at 3 tokens."""
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.5, natural_len=3)) as h:
        code, body = post(h.url + "/v1/completions", {"prompt": "a", "max_tokens": 10})
        assert json.loads(body)["usage"]["completion_tokens"] == 3
        for api in ("completions", "chat", "sglang"):
            cfg = BenchConfig(base_url=h.url, api=api,
                              workload=WorkloadConfig(input_len=4, output_len=10, num_prompts=2))
            res = run_load_point(cfg, LoadPoint(concurrency=2), progress=False)
            assert [r["output_tokens"] for r in res.records] == [10, 10], api
            assert res.summary["output_len_mismatch"] == 0


@pytest.mark.parametrize("bad", [dict(tokens_per_chunk=0), dict(fail_rate=2.0),
                                 dict(flavor="trt"), dict(ttft_ms=-1)])
def test_script_validation(bad):
    with pytest.raises(ValueError):
        Script(**bad)
