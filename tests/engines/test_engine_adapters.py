"""Engine adapters: rendered command lines, metrics parsing, acceptance windows, recipes."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from servelab import engines
from servelab.engines import recipe
from servelab.engines.base import (
    ProcessConfig,
    ProcessPlan,
    parse_prometheus,
    render_flags,
    spec_window,
)
from servelab.engines.launcher import Launcher
from servelab.errors import UserError


def test_render_flags():
    assert render_flags(
        {"tp-size": 8, "trust-remote-code": True, "cuda-graph-bs": [1, 2], "gone": False, "x": 0.5}
    ) == ["--tp-size", "8", "--trust-remote-code", "--cuda-graph-bs", "1", "2", "--x", "0.5"]


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


def test_vllm_and_embedded_commands():
    v = engines.get("vllm").command(
        ProcessConfig(role="server", flags={"max-num-seqs": 8}, port=8000), "m", {}
    )
    venv = Launcher(python="/opt/vllm/bin/python")
    v2 = engines.get("vllm").command(
        ProcessConfig(role="server", flags={}, port=8000, launcher=venv), "m", {})
    assert v2[:5] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.cli.main", "serve", "m"]
    assert v == [
        "vllm",
        "serve",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--max-num-seqs",
        "8",
    ]
    e = engines.get("embedded").command(
        ProcessConfig(role="server", flags={"device": "cpu"}, port=9), "tiny", {}
    )
    assert e[1:] == [
        "-m",
        "servelab",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "9",
        "--device",
        "cpu",
        "--config",
        "tiny",
    ]
    with pytest.raises(UserError, match="unknown engine 'tgi'"):
        engines.get("tgi")


def test_prometheus_parse_and_acceptance_window_vs_prometheus_client():
    def expo(drafts, draft_tokens, accepted):
        reg = CollectorRegistry()
        for name, v in (
            ("vllm:spec_decode_num_drafts", drafts),
            ("vllm:spec_decode_num_draft_tokens", draft_tokens),
            ("vllm:spec_decode_num_accepted_tokens", accepted),
        ):
            Counter(name, "x", registry=reg).inc(v)
        Gauge("sglang:spec_accept_length", "x", ["model"], registry=reg).labels(model="m").set(1.7)
        return parse_prometheus(generate_latest(reg).decode())

    before, after = expo(10, 30, 12), expo(110, 330, 192)
    assert after['sglang:spec_accept_length{model="m"}'] == 1.7
    w = spec_window(before, after)
    assert w["accept_length"] == pytest.approx(1 + 180 / 100)  # tau = 1 + d(acc)/d(drafts)
    assert w["accept_rate"] == pytest.approx(180 / 300)
    assert w["source"] == "metrics-window"
    assert spec_window(None, after) == {"accept_length": None, "accept_rate": None, "source": None}
    # SGLang serves gauges, not counters: its adapter falls back to the gauge after the window
    sg = engines.get("sglang").acceptance(before, {'sglang:spec_accept_length{model="m"}': 1.7})
    assert sg == {"accept_length": 1.7, "accept_rate": None, "source": "sglang-gauge"}
    assert engines.get("sglang").acceptance(before, after)["accept_length"] == pytest.approx(2.8)


def test_acceptance_window_sums_vllm_label_sets():
    """vLLM labels its spec-decode counters by model and engine (one series per engine core):
    the window must sum the series, computed here independently from the raw counts."""

    def expo(per_engine):
        reg = CollectorRegistry()
        names = (
            "vllm:spec_decode_num_drafts",
            "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens",
        )
        counters = [Counter(n, "x", ["model_name", "engine"], registry=reg) for n in names]
        for engine, counts in per_engine.items():
            for c, v in zip(counters, counts, strict=True):
                c.labels(model_name="m", engine=engine).inc(v)
        return parse_prometheus(generate_latest(reg).decode())

    before = expo({"0": (10, 20, 5), "1": (4, 8, 2)})
    after = expo({"0": (60, 120, 45), "1": (24, 48, 12)})
    d_drafts, d_tokens, d_acc = (60 - 10) + (24 - 4), (120 - 20) + (48 - 8), (45 - 5) + (12 - 2)
    w = spec_window(before, after)
    assert w["accept_length"] == pytest.approx(1 + d_acc / d_drafts)
    assert w["accept_rate"] == pytest.approx(d_acc / d_tokens)
    assert w["source"] == "metrics-window"


def test_recipes_are_data_with_constraints():
    names = set(recipe.all_recipes())
    assert {
        "mtp-conservative",
        "mtp-engine-test",
        "nccl-ll",
        "cuda-graph-off",
        "cuda-graph-on",
    } <= names
    test = recipe.get("mtp-engine-test").flags_for("sglang")
    assert (
        test["speculative-num-steps"],
        test["speculative-eagle-topk"],
        test["speculative-num-draft-tokens"],
    ) == (3, 1, 4)
    assert recipe.get("nccl-ll").env == {"NCCL_PROTO": "LL"}
    ok = {"speculative-algorithm": "EAGLE", "speculative-eagle-topk": 1}
    assert recipe.constraint_problems("deepseek-ai/DeepSeek-V4-Flash", ok) == []
    assert recipe.constraint_problems("deepseek-ai/DeepSeek-V4-Flash", {}) == []  # no MTP: n/a
    assert (
        recipe.constraint_problems("meta-llama/Llama-3", {**ok, "speculative-eagle-topk": 4}) == []
    )
    bad = recipe.constraint_problems("DeepSeek-V4-Pro", {**ok, "speculative-algorithm": "NGRAM"})
    assert len(bad) == 1 and "speculative-algorithm='NGRAM'" in bad[0]
    with pytest.raises(UserError, match="no settings for engine 'vllm'"):
        recipe.Recipe("r", "", "", {"sglang": {}}, {}, ("sglang",)).flags_for("vllm")


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
