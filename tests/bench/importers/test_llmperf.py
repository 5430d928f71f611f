"""LLMPerf (not on PyPI: it could not be installed here) from its documented layout: the
summary keys of ray-project/llmperf's published results (benchmarks/results/.../
*_summary.json) and the per-request keys its clients write (`ttft_s`,
`end_to_end_latency_s`, `inter_token_latency_s`, `number_output_tokens`, `error_code`, ...).
Values are chosen so the arithmetic is checkable by hand."""

from __future__ import annotations

import json

import pytest

from servelab.bench.importers import import_file
from servelab.errors import UserError
from servelab.store import Store

# three requests: TTFT 0.1 s, E2E 0.1 + (n - 1) x 0.02 s, so TPOT is 20 ms each; one failed
RESPONSES = [
    {"error_code": None, "error_msg": "", "ttft_s": 0.1, "end_to_end_latency_s": 0.1 + 9 * 0.02,
     "inter_token_latency_s": 0.028, "number_output_tokens": 10, "number_input_tokens": 50,
     "number_total_tokens": 60, "request_output_throughput_token_per_s": 35.7},
    {"error_code": None, "error_msg": "", "ttft_s": 0.1, "end_to_end_latency_s": 0.1 + 19 * 0.02,
     "inter_token_latency_s": 0.024, "number_output_tokens": 20, "number_input_tokens": 50,
     "number_total_tokens": 70, "request_output_throughput_token_per_s": 41.7},
    {"error_code": 429, "error_msg": "Too Many Requests", "ttft_s": 0, "end_to_end_latency_s": 0,
     "inter_token_latency_s": 0, "number_output_tokens": 0, "number_input_tokens": 50,
     "number_total_tokens": 50, "request_output_throughput_token_per_s": 0},
]
SUMMARY = {
    "version": "2023-08-31", "name": "m_50_15_summary", "model": "org/m",
    "mean_input_tokens": 50, "stddev_input_tokens": 0, "mean_output_tokens": 15,
    "stddev_output_tokens": 0, "num_concurrent_requests": 2,
    "results_inter_token_latency_s_quantiles_p50": 0.026, "results_inter_token_latency_s_mean": 0.026,
    "results_ttft_s_quantiles_p50": 0.1, "results_ttft_s_quantiles_p90": 0.1,
    "results_ttft_s_quantiles_p99": 0.1, "results_ttft_s_mean": 0.1, "results_ttft_s_min": 0.1,
    "results_ttft_s_max": 0.1, "results_ttft_s_stddev": 0.0,
    "results_end_to_end_latency_s_quantiles_p50": 0.39, "results_end_to_end_latency_s_mean": 0.39,
    "results_number_input_tokens_mean": 50.0, "results_number_input_tokens_min": "50",
    "results_number_output_tokens_mean": 15.0, "results_num_requests_started": 3,
    "results_error_rate": 0.333, "results_number_errors": 1,
    "results_error_code_frequency": "{429: 1}",
    "results_mean_output_throughput_token_per_s": 15.0,
    "results_num_completed_requests": 2, "results_num_completed_requests_per_min": 60.0,
    "timestamp": 1718208921,
}


def _write(tmp, summary=SUMMARY, responses=RESPONSES):
    f = tmp / "m_50_15_summary.json"
    f.write_text(json.dumps(summary))
    if responses is not None:
        (tmp / "m_50_15_individual_responses.json").write_text(json.dumps(responses))
    return f


def test_llmperf_summary_and_responses(tmp_path):
    with Store(tmp_path / "s.db") as st:
        ids, _ = import_file(st, "llmperf", _write(tmp_path))
        lp = st.load_point(ids[0])
        reqs = list(st.requests(lp))
    s = lp.summary
    assert lp.load_key == "c=2" and lp.model == "org/m"
    assert s["duration_s"] == 2.0  # 2 completed at 60 per minute
    assert s["ttft_ms"]["mean"] == pytest.approx(100.0) and s["ttft_ms"]["p90"] == \
        pytest.approx(100.0)
    # their ITL (TTFT inside) is kept apart, never called TPOT ...
    assert s["e2e_per_token_ms"]["mean"] == pytest.approx(26.0)
    # ... and our TPOT comes from the responses: (E2E - TTFT) / (n - 1) = 20 ms for both
    assert s["tpot_ms"]["mean"] == pytest.approx(20.0) and s["tpot_ms"]["median"] == \
        pytest.approx(20.0)
    assert s["failed"] == 1 and s["failure_reasons"] == {"http_429": 1}
    assert s["total_output_tokens"] == 30 and s["total_input_tokens"] == 100
    assert [r["error"] for r in reqs] == [None, None, "http_429"]
    assert reqs[2]["ttft_ms"] is None  # a failed request has no latency, not 0


def test_llmperf_summary_alone_has_no_tpot(tmp_path):
    with Store(tmp_path / "s.db") as st:
        s = st.load_point(import_file(st, "llmperf", _write(tmp_path, responses=None))[0][0]).summary
    assert s["tpot_ms"]["mean"] is None and s["e2e_per_token_ms"]["mean"] == pytest.approx(26.0)
    assert s["total_output_tokens"] == 30  # mean x completed


@pytest.mark.parametrize("change,word", [
    ({"results_num_completed_requests_per_min": 0}, "per_min"),
    ({"results_ttft_s_mean": -1}, "results_ttft_s_mean"),
    ({"results_number_input_tokens_min": "many"}, "results_number_input_tokens_min"),
    ({"results_error_code_frequency": "__import__('os')"}, "not a mapping"),
])
def test_bad_summaries_are_refused(tmp_path, change, word):
    with Store(tmp_path / "s.db") as st:
        with pytest.raises(UserError) as exc:
            import_file(st, "llmperf", _write(tmp_path, {**SUMMARY, **change}))
        assert word in str(exc.value) and st.load_points() == []


def test_a_bad_response_names_it(tmp_path):
    bad = [*RESPONSES[:1], {**RESPONSES[1], "number_output_tokens": 2.5}]
    with Store(tmp_path / "s.db") as st, pytest.raises(UserError, match="response 2: "
                                                                         "'number_output_tokens'"):
        import_file(st, "llmperf", _write(tmp_path, responses=bad))
