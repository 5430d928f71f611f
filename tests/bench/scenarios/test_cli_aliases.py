"""The engines' flag names run the same measurement as ours: a command line copied from SGLang's
`bench_serving` or vLLM's `bench serve` works, and `--request-rate inf` sends every request at
once (checked on the scripted server's own arrival log)."""

from __future__ import annotations

import json

import pytest
from cli_inproc import cli

from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script
from servelab.store import Store


def test_vllm_command_line(monkeypatch, capsys, tmp_path):
    with serve_in_thread(Script(ttft_ms=5, gap_ms=1)) as h:
        code, out, err = cli(monkeypatch, capsys, "bench", "--base-url", h.url,
                             "--max-concurrency", "3", "--request-rate", "inf",
                             "--num-prompts", "6", "--random-input-len", "7",
                             "--random-output-len", "5", "--num-warmups", "2",
                             "--goodput", "ttft:500 tpot:50", "--save-result",
                             "--result-dir", str(tmp_path), "--result-filename", "v.json",
                             "--quiet", "--label", "vllm-style")
        log = h.log()
    assert code == 0, err
    v = json.loads((tmp_path / "v.json").read_text())  # vLLM's own result layout
    # inf + a concurrency is a closed loop
    assert (v["request_rate"], v["max_concurrency"], v["label"]) == ("inf", 3, "vllm-style")
    assert v["completed"] == 6 and v["total_output_tokens"] == 30
    assert v["request_goodput"] == pytest.approx(v["request_throughput"])
    assert len(log) == 8 and {r["prompt_tokens"] for r in log} == {7}
    with Store() as st:
        assert [r.label for r in st.load_points()] == ["vllm-style"]


def test_sglang_command_line_and_rate_inf(monkeypatch, capsys, tmp_path):
    out_file = tmp_path / "s.json"
    with serve_in_thread(Script(ttft_ms=30, gap_ms=1)) as h:
        code, out, err = cli(monkeypatch, capsys, "bench", "--base-url", h.url,
                             "--request-rate", "inf", "--num-prompts", "8",
                             "--random-input-len", "4", "--random-output-len", "3",
                             "--warmup-requests", "1", "--output-file", str(out_file), "--quiet",
                             "--no-store")
        log = h.log()
    assert code == 0, err
    s = json.loads(out_file.read_text())["load_points"][0]
    assert s["load_key"] == "rate=inf" and s["completed"] == 8 and s["concurrency"] is None
    measured = sorted(r["arrival_ns"] for r in log)[1:]  # the first is the warmup request
    # all at once: every request arrives before the first answer (30 ms) could come back
    assert (measured[-1] - measured[0]) / 1e6 < 30.0
    assert "rate=inf" in out


def test_sweep_without_slo_profiles_and_stores(monkeypatch, capsys, tmp_path):
    s = Script(ttft_ms=5, gap_ms=2, max_running=2)
    with serve_in_thread(s) as h:
        code, out, err = cli(monkeypatch, capsys, "bench", "--base-url", h.url, "--sweep",
                             "--sweep-rates", "2", "--num-prompts", "6", "--input-len", "4",
                             "--output-len", "3", "--quiet", "--output", str(tmp_path / "o.json"))
    assert code == 0, err
    doc = json.loads((tmp_path / "o.json").read_text())
    assert doc["sweep"]["capacity"] is None and doc["sweep"]["slo"] is None
    assert [p["role"] for p in doc["sweep"]["points"]] == ["synchronous", "throughput", "grid",
                                                           "grid"]
    assert "capacity sweep" in out and "capacity:" not in out
    with Store() as st:
        assert len(st.load_points()) == 4
