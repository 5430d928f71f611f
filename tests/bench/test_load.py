"""Load drivers: seeded Poisson/gamma arrivals (statistics against scipy's distributions), the
concurrency cap as the server saw it, warmup excluded, --max-duration."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.load import arrival_offsets_s
from servelab.bench.run import run_load_point
from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script


@pytest.mark.parametrize("burstiness", [1.0, 0.5, 4.0])
def test_interarrival_distribution(burstiness):
    rate, n = 8.0, 20000
    offs = arrival_offsets_s(n, rate, burstiness, seed=11)
    assert offs[0] == 0.0 and np.all(np.diff(offs) >= 0)
    gaps = np.diff(offs)
    # mean 1/rate; coefficient of variation 1/sqrt(shape); the gamma law itself (KS test)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.05)
    ks = stats.kstest(gaps, stats.gamma(a=burstiness, scale=1 / (rate * burstiness)).cdf)
    assert ks.pvalue > 1e-3
    if burstiness == 1.0:  # Poisson: exponential gaps
        assert stats.kstest(gaps, stats.expon(scale=1 / rate).cdf).pvalue > 1e-3


def test_arrivals_are_seeded():
    a = arrival_offsets_s(50, 4.0, 1.0, seed=1)
    assert np.array_equal(a, arrival_offsets_s(50, 4.0, 1.0, seed=1))
    assert not np.array_equal(a, arrival_offsets_s(50, 4.0, 1.0, seed=2))


def in_flight_max(log: list[dict]) -> int:
    ev = sorted([(r["arrival_ns"], 1) for r in log] + [(r["done_ns"], -1) for r in log])
    cur = best = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


def test_closed_loop_keeps_the_concurrency_and_excludes_warmup():
    with serve_in_thread(Script(ttft_ms=5, gap_ms=2)) as h:
        cfg = BenchConfig(base_url=h.url, warmup=3,
                          workload=WorkloadConfig(input_len=4, output_len=5, num_prompts=12))
        res = run_load_point(cfg, LoadPoint(concurrency=4), progress=False)
        log = h.log()
    assert len(log) == 15  # 3 warmup + 12 measured reached the server
    warm_ids = {r["id"] for r in sorted(log, key=lambda r: r["arrival_ns"])[:3]}
    measured = [r for r in log if r["id"] not in warm_ids]
    assert {r["response_id"] for r in res.records} == {r["id"] for r in measured}
    assert res.summary["completed"] == 12 and res.summary["warmup"] == 3
    # the server saw 4 at once (its done time is taken a moment after [DONE] leaves, so it may
    # briefly overlap the next arrival); the client never had more than 4 in flight
    assert in_flight_max(measured) in (4, 5)
    spans = [{"arrival_ns": r["t_start_ns"], "done_ns": r["t_start_ns"] + int(r["e2e_ms"] * 1e6)}
             for r in res.records]
    assert in_flight_max(spans) == 4


def test_max_duration_stops_issuing():
    with serve_in_thread(Script(ttft_ms=20, gap_ms=5)) as h:
        cfg = BenchConfig(base_url=h.url, max_duration_s=0.3,
                          workload=WorkloadConfig(input_len=4, output_len=5, num_prompts=500))
        res = run_load_point(cfg, LoadPoint(concurrency=2), progress=False)
        log = h.log()
    s = res.summary
    assert s["stopped_by_duration"] is True
    assert 2 <= s["issued"] < 500 and s["completed"] == s["issued"] == len(log)
    # the last request was issued before the cap; each takes >= 40 ms
    assert max(r["start_s"] for r in res.records) < 0.3
    assert 0.3 <= s["duration_s"] < 1.5


def test_open_loop_does_not_wait_for_answers():
    """At 100 req/s with 100 ms answers, about 10 are in flight: a closed loop would have 1."""
    with serve_in_thread(Script(ttft_ms=60, gap_ms=10)) as h:
        cfg = BenchConfig(base_url=h.url, workload=WorkloadConfig(input_len=4, output_len=5,
                                                                  num_prompts=30, seed=3))
        res = run_load_point(cfg, LoadPoint(request_rate=100.0, burstiness=1.0), progress=False)
        log = h.log()
    assert res.summary["completed"] == 30 and res.summary["load_key"] == "rate=100"
    assert in_flight_max(log) >= 5


def test_max_duration_before_the_first_request_leaves_rates_missing():
    """Nothing sent: duration and every rate are null (not 0), as is the acceptance gauge."""
    with serve_in_thread(Script(ttft_ms=1, gap_ms=1, tokens_per_chunk=2, flavor="sglang")) as h:
        cfg = BenchConfig(base_url=h.url, max_duration_s=1e-9,
                          workload=WorkloadConfig(input_len=4, output_len=5, num_prompts=3))
        run_load_point(BenchConfig(base_url=h.url, workload=cfg.workload),
                       LoadPoint(concurrency=1), progress=False)  # the gauge now reads 2
        res = run_load_point(cfg, LoadPoint(concurrency=1), progress=False)
    s = res.summary
    assert s["issued"] == 0 and s["completed"] == 0 and s["failed"] == 0
    assert s["duration_s"] is None and s["request_throughput_req_s"] is None
    assert s["output_throughput_tok_s"] is None and s["accept_length"] is None
