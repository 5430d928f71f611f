"""Metric definitions on hand-made token events (values worked out by hand in the comments)."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from servelab.bench.client import RawResult
from servelab.bench.metrics import make_record, meets_slo, split_tokens, stats, summarize
from servelab.bench.workload import RequestSpec

MS = 1_000_000


def spec(out: int = 7) -> RequestSpec:
    return RequestSpec(0, "p", 10, out, True)


def raw(events, end_ms, **kw) -> RawResult:
    r = RawResult(index=0, t_start_ns=1000 * MS, t_end_ns=(1000 + end_ms) * MS, end_marker=True, **kw)
    r.events = [((1000 + t) * MS, n, txt) for t, n, txt in events]
    return r


def test_chunked_events_per_token_itl_and_tpot():
    # 1 token at 20 ms, then chunks of 3 tokens after 6 ms and 3 tokens after 9 ms; [DONE] at 36
    r = raw([(20, None, "a"), (26, None, "bbb"), (35, None, "ccc")], 36, completion_tokens=7)
    rec = make_record(r, spec(), t0_ns=1000 * MS)
    assert rec.ok and rec.ttft_ms == pytest.approx(20) and rec.e2e_ms == pytest.approx(36)
    assert rec.tpot_ms == pytest.approx((36 - 20) / 6)
    assert rec.chunk_tokens == (1, 3, 3)
    assert rec.itl_ms == pytest.approx((2, 2, 2, 3, 3, 3))
    assert rec.chunk_gap_ms == pytest.approx((6, 9))
    assert rec.output_tokens == 7 and rec.output_tokens_source == "usage"


def test_token_counts_from_sglang_meta_and_from_chunks():
    r = raw([(5, 1, "x"), (7, 4, "yy")], 8)
    rec = make_record(r, spec(5), 1000 * MS)
    assert rec.chunk_tokens == (1, 4) and rec.output_tokens == 5
    assert rec.output_tokens_source == "meta_info" and rec.itl_ms == pytest.approx((0.5,) * 4)
    # no usage, no tokenizer: one token per chunk, flagged
    rec2 = make_record(raw([(5, None, "x"), (7, None, "yy")], 8), spec(5), 1000 * MS)
    assert rec2.output_tokens == 2 and rec2.output_tokens_source == "chunks"
    # a local tokenizer counts the text
    rec3 = make_record(raw([(5, None, "x"), (7, None, "yy")], 8), spec(5), 1000 * MS,
                       count=lambda t: len(t))
    assert rec3.output_tokens == 3 and rec3.output_tokens_source == "tokenizer"


def test_one_token_answer_has_no_tpot_and_failures_have_no_latency():
    rec = make_record(raw([(5, None, "x")], 6, completion_tokens=1), spec(1), 1000 * MS)
    assert rec.tpot_ms is None and rec.itl_ms == ()
    bad = raw([(5, None, "x")], 6)
    bad.error = "connection_lost"
    rec2 = make_record(bad, spec(), 1000 * MS)
    assert not rec2.ok and rec2.ttft_ms is None and rec2.e2e_ms is None and rec2.tpot_ms is None


def test_split_tokens_proportional_and_exact_total():
    assert split_tokens(["a", "bbb", "ccc"], 7) == [1, 3, 3]
    assert sum(split_tokens(["ab", "c", "defg", "h"], 11)) == 11
    assert split_tokens(["a", "b", "c"], 2) == [1, 1, 0]
    assert split_tokens([], 3) == []


def test_stats_against_statistics_module():
    v = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    s = stats(v)
    assert s["mean"] == pytest.approx(statistics.fmean(v))
    assert s["median"] == pytest.approx(statistics.median(v))
    assert s["std"] == pytest.approx(statistics.pstdev(v))
    # linear interpolation between order statistics: p90 of 1..101 is 91
    assert stats(range(1, 102))["p90"] == pytest.approx(91.0)
    assert stats(range(1, 102))["p95"] == pytest.approx(96.0)
    assert stats([]) == dict.fromkeys(("mean", "median", "p90", "p95", "p99", "std"))
    assert stats([None, 2.0])["mean"] == 2.0
    assert np.isfinite(s["p99"])


def test_summary_throughput_goodput_and_missing_values():
    recs = []
    for i, (ttft, end) in enumerate([(10, 40), (50, 80), (10, 200)]):
        r = raw([(ttft, None, "a"), (end - 1, None, "b")], end, completion_tokens=4, prompt_tokens=10)
        r.index = i
        recs.append(make_record(r, spec(4), 1000 * MS))
    s = summarize(recs, duration_s=2.0, goodput_slo={"ttft_ms": 20, "e2e_ms": 100})
    assert s["completed"] == 3 and s["failed"] == 0
    assert s["output_throughput_tok_s"] == pytest.approx(12 / 2)
    assert s["input_throughput_tok_s"] == pytest.approx(30 / 2)
    assert s["total_throughput_tok_s"] == pytest.approx(42 / 2)
    assert s["request_throughput_req_s"] == pytest.approx(1.5)
    assert s["goodput_req_s"] == pytest.approx(1 / 2)  # only the first meets both SLOs
    assert summarize(recs, 2.0, None)["goodput_req_s"] is None
    assert meets_slo(recs[0], {"tpot_ms": 1000}) and not meets_slo(recs[1], {"ttft_ms": 20})
    empty = summarize([], 0.0, None)
    assert empty["output_throughput_tok_s"] is None and empty["ttft_ms"]["p99"] is None


def test_goodput_parsing_accepts_vllm_names():
    from servelab.bench.config import parse_goodput

    assert parse_goodput("ttft=500, tpot_ms=50,e2el=9000") == {"ttft_ms": 500.0, "tpot_ms": 50.0,
                                                               "e2e_ms": 9000.0}
    assert parse_goodput(None) == {}


def lagged(lags_ms: list[float]) -> list:
    """Records of requests sent 100 ms apart, each `lag` ms after its due time."""
    out = []
    for i, lag in enumerate(lags_ms):
        r = raw([(5, 1, "x"), (7, 1, "y")], 8)
        r.t_start_ns += i * 100 * MS
        r.t_due_ns = r.t_start_ns - int(lag * MS)
        out.append(make_record(r, spec(2), t0_ns=1000 * MS))
    return out


def test_dispatch_lag_and_when_the_client_is_behind():
    s = summarize(lagged([0.5] * 59 + [40.0]), 6.0, None)  # one hiccup in 60: not a trend
    lag = s["dispatch_lag_ms"]
    assert lag["median"] == pytest.approx(0.5) and lag["max"] == pytest.approx(40.0)
    assert lag["late"] == 1 and s["dispatch_behind"] is False
    s = summarize(lagged([0.5] * 96 + [12.0] * 4), 10.0, None)  # 4% sent > 10 ms late
    assert s["dispatch_lag_ms"]["late"] == 4 and s["dispatch_behind"] is True
    s = summarize(lagged([0.1 * i for i in range(100)]), 10.0, None)  # a lag that keeps growing
    assert s["dispatch_lag_ms"]["growth"] == pytest.approx(9.0, abs=0.01)
    assert s["dispatch_behind"] is False  # up to 9.9 ms: still on time
    s = summarize(lagged([0.12 * i for i in range(100)]), 10.0, None)  # the last 16 over 10 ms
    assert s["dispatch_lag_ms"]["late"] == 16 and s["dispatch_behind"] is True
    assert summarize(lagged([]), 1.0, None)["dispatch_lag_ms"] is None  # closed loop: no lag
