"""Speculative acceptance length from each source, the source named, and window deltas."""

from __future__ import annotations

import pytest

from servelab.bench import spec_metrics
from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.run import run_load_point
from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script

K = 3
OUT = 1 + 4 * K  # every verify chunk full: true tau == K


def run(script: Script, api: str = "completions") -> dict:
    with serve_in_thread(script) as h:
        cfg = BenchConfig(base_url=h.url, api=api,
                          workload=WorkloadConfig(input_len=4, output_len=OUT, num_prompts=6))
        return run_load_point(cfg, LoadPoint(concurrency=3), progress=False).summary


@pytest.mark.parametrize("script,api,source", [
    (Script(ttft_ms=1, gap_ms=1, tokens_per_chunk=K), "sglang", "response:spec_verify_ct"),
    (Script(ttft_ms=1, gap_ms=1, tokens_per_chunk=K), "completions", "metrics:vllm"),
    (Script(ttft_ms=1, gap_ms=1, tokens_per_chunk=K, flavor="sglang"), "chat", "metrics:sglang"),
    (Script(ttft_ms=1, gap_ms=1, tokens_per_chunk=K, metrics=False), "completions",
     "estimate:tokens_per_chunk"),
])
def test_each_source(script, api, source):
    s = run(script, api)
    assert s["completed"] == 6
    assert s["accept_length_source"] == source
    assert s["accept_length"] == pytest.approx(K, abs=1e-12)
    if source == "metrics:vllm":
        assert s["accept_rate"] == pytest.approx(1.0)  # the script accepts every draft


def test_partial_last_chunk_response_and_counter_agree():
    """13 tokens in chunks of 5: 1 + 5 + 5 + 2 -> tau = 12 / 3 = 4 by both server-side sources."""
    with serve_in_thread(Script(ttft_ms=1, gap_ms=1, tokens_per_chunk=5)) as h:
        cfg = BenchConfig(base_url=h.url, api="sglang",
                          workload=WorkloadConfig(input_len=4, output_len=13, num_prompts=4))
        s = run_load_point(cfg, LoadPoint(concurrency=2), progress=False).summary
    by = s["accept_length_by_source"]
    assert by["response:spec_verify_ct"] == pytest.approx(4.0)
    assert by["metrics:vllm"] == pytest.approx(4.0)
    assert by["estimate:tokens_per_chunk"] == pytest.approx(4.0)


def test_vllm_window_uses_deltas_not_lifetime():
    before = {spec_metrics.VLLM_DRAFTS: 100.0, spec_metrics.VLLM_ACCEPTED: 100.0,
              spec_metrics.VLLM_DRAFT_TOKENS: 300.0}
    after = {spec_metrics.VLLM_DRAFTS: 200.0, spec_metrics.VLLM_ACCEPTED: 400.0,
             spec_metrics.VLLM_DRAFT_TOKENS: 600.0}
    tau, rate = spec_metrics.from_vllm(before, after)
    assert tau == pytest.approx(4.0)  # lifetime would say 1 + 400/200 = 3
    assert rate == pytest.approx(1.0)
    assert spec_metrics.from_vllm(after, after) == (None, None)  # no drafts in the window
    # the scrape before the load point failed: lifetime totals must not pass for the window
    assert spec_metrics.from_vllm({}, after) == (None, None)
    # scraped, but the spec counters not exported yet: they were 0
    assert spec_metrics.from_vllm({"vllm:num_requests_running": 0.0}, after)[0] == pytest.approx(3.0)


def test_prometheus_parsing_sums_labels_and_drops_total():
    text = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 7.0
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="m"} 2.5
"""
    v = spec_metrics.parse_prometheus(text)
    assert v[spec_metrics.VLLM_DRAFTS] == 15.0
    assert v[spec_metrics.SGLANG_ACCEPT_LENGTH] == 2.5
    # per position: kept apart, never summed into one number
    assert v[spec_metrics.VLLM_ACCEPTED_PER_POS + "#0"] == 7.0
    assert spec_metrics.VLLM_ACCEPTED_PER_POS not in v
    assert spec_metrics.parse_prometheus("not prometheus {{{") == {}


def test_sglang_gauge_is_not_reported_for_a_window_without_completed_requests():
    """The gauge is the server's recent average: with nothing completed in the window it would
    report earlier traffic's tau as this load point's."""
    from servelab.bench.client import RawResult
    from servelab.bench.metrics import make_record
    from servelab.bench.workload import RequestSpec

    failed = RawResult(index=0, t_start_ns=0, t_end_ns=10, error="http_500")
    rec = make_record(failed, RequestSpec(0, "p", 4, OUT, True), 0)
    after = {spec_metrics.SGLANG_ACCEPT_LENGTH: 2.5, spec_metrics.SGLANG_ACCEPT_RATE: 0.75}
    a = spec_metrics.acceptance([rec], {}, after)
    assert a["accept_length"] is None and a["accept_length_source"] is None
    assert a["accept_rate"] is None
    ok = RawResult(index=1, t_start_ns=0, t_end_ns=10, end_marker=True, completion_tokens=1)
    ok.events = [(5, None, "x")]
    a = spec_metrics.acceptance([make_record(ok, RequestSpec(1, "p", 4, 1, True), 0)], {}, after)
    assert a["accept_length_source"] == "metrics:sglang" and a["accept_length"] == 2.5


def test_server_without_speculative_metrics_has_no_tau():
    """/metrics answers but carries no spec_decode/spec_accept metric: the server is not
    speculating, so tau is None even though the chunk estimate exists (1.0 here)."""
    s = run(Script(ttft_ms=1, gap_ms=1, tokens_per_chunk=1))
    assert s["completed"] == 6
    assert s["accept_length"] is None and s["accept_length_source"] is None
    assert s["accept_length_by_source"]["estimate:tokens_per_chunk"] == pytest.approx(1.0)


def test_speculating_from_metrics():
    """vLLM: spec counters exist only when speculating; SGLang: the gauge exists always, 0 when
    not speculating."""
    assert spec_metrics.speculating({"vllm:spec_decode_num_drafts": 0.0})
    assert not spec_metrics.speculating({"vllm:num_requests_running": 1.0})
    assert not spec_metrics.speculating({spec_metrics.SGLANG_ACCEPT_LENGTH: 0.0,
                                         "sglang:num_running_reqs": 2.0})
    assert spec_metrics.speculating({spec_metrics.SGLANG_ACCEPT_LENGTH: 2.4})


def test_vllm_counts_are_the_windows_deltas_with_the_rate_per_position():
    """As `vllm bench serve` reports them: counter deltas between the scrapes, and accepted
    tokens at position i over drafts. Text made by prometheus_client, as vLLM serves it."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    reg = CollectorRegistry()
    drafts = Counter("vllm:spec_decode_num_drafts", "", registry=reg)
    toks = Counter("vllm:spec_decode_num_draft_tokens", "", registry=reg)
    acc = Counter("vllm:spec_decode_num_accepted_tokens", "", registry=reg)
    pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "", ["position"], registry=reg)

    def step(n: int, accepted: tuple[int, int, int]) -> None:
        drafts.inc(n)
        toks.inc(3 * n)
        acc.inc(sum(accepted))
        for i, a in enumerate(accepted):
            pos.labels(position=str(i)).inc(a)

    step(4, (4, 2, 1))  # before the window
    before = spec_metrics.parse_prometheus(generate_latest(reg).decode())
    step(10, (9, 6, 2))
    after = spec_metrics.parse_prometheus(generate_latest(reg).decode())
    c = spec_metrics.vllm_counts(before, after)
    assert c == {"num_drafts": 10, "draft_tokens": 30, "accepted_tokens": 17,
                 "per_position_acceptance_rates": [0.9, 0.6, 0.2]}
    assert spec_metrics.vllm_counts({}, after) is None       # no scrape before: no window
    assert spec_metrics.vllm_counts(after, after) is None    # no draft in the window
