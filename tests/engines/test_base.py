"""What every engine adapter shares (engines/base.py): rendered flags, Prometheus text parsed,
and the speculative-acceptance window between two scrapes."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from servelab import engines
from servelab.engines.base import (
    parse_prometheus,
    render_flags,
    spec_window,
)


def test_render_flags():
    assert render_flags(
        {"tp-size": 8, "trust-remote-code": True, "cuda-graph-bs": [1, 2], "gone": False, "x": 0.5}
    ) == ["--tp-size", "8", "--trust-remote-code", "--cuda-graph-bs", "1", "2", "--x", "0.5"]


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
