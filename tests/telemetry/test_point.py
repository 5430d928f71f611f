"""A load point's telemetry summary (telemetry/point.py) on series whose truth is known by
construction: a queue that grows by 2 requests per second, GPUs at a known power, a burst sent
in milliseconds. The live path (scripted server, store) is tests/bench/scenarios/
test_run_telemetry.py."""

from __future__ import annotations

import pytest
from fake_nvml import FakeNVML

from servelab.telemetry.gpu import GpuSample, GpuSeries
from servelab.telemetry.point import in_flight, summarize
from servelab.telemetry.server import ServerSeries


def _server(queue: list[float | None], dt: float = 0.25) -> ServerSeries:
    s = ServerSeries(url="http://x/metrics", interval_s=dt)
    for i, q in enumerate(queue):
        s.add(i * dt, {"queued_requests": q, "running_requests": 4.0,
                       "generation_tokens": 100.0 * i})
    return s


def _gpu(power_w: float, seconds: int, throttle: int = 0) -> GpuSeries:
    g = GpuSeries(interval_s=1.0, gpus=[{"index": 0, "name": "NVIDIA H200"}])
    g.samples = [GpuSample(t_s=float(t), gpu=0, sm_clock_mhz=1980, mem_clock_mhz=3201,
                           power_w=power_w, energy_mj=int(1e6 + t * power_w * 1000),
                           temperature_c=60, util_gpu_pct=90, util_mem_pct=40,
                           throttle_mask=throttle) for t in range(seconds + 1)]
    return g


def _reqs(rate: float, seconds: float, service_s: float, start: float = 0.5):
    n = int(rate * seconds)
    return [(start + i / rate, start + i / rate + service_s, 50.0) for i in range(n)]


def test_in_flight_counts_sent_and_not_answered():
    reqs = [(0.0, 1.0, None), (0.5, 2.0, None), (1.5, 1.6, None)]
    t, n = in_flight(reqs, 0.0, 2.0, n=5)  # 0, 0.5, 1.0, 1.5, 2.0
    assert t == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert n == [1.0, 2.0, 1.0, 2.0, 0.0]  # answered at t: no longer in flight at t


def test_a_growing_queue_is_above_saturation_and_its_max_is_kept():
    # 40 scrapes at 4/s over 10 s, the queue +2 requests/s: arrivals exceed service
    srv = _server([2.0 * i * 0.25 for i in range(41)])
    out = summarize(srv, GpuSeries(interval_s=1.0, status="n/a: no NVIDIA GPU"),
                    sent=_reqs(10, 9.5, 0.5), t_end_s=10.0, output_tokens=950)
    assert out["steadiness"]["status"] == "above_saturation", out["steadiness"]["reason"]
    assert out["above_saturation"] is True
    assert out["steadiness"]["queue_source"] == "server"
    assert out["steadiness"]["trends"]["queue"]["slope_per_s"] == pytest.approx(2.0, rel=0.05)
    assert out["max_queued_requests"] == 20.0
    # no GPU: said once in the summary, energy and throttling missing, not 0
    assert out["telemetry"]["gpu_status"].startswith("n/a")
    assert out["energy"] is None and out["j_per_output_token"] is None
    assert out["throttle_reasons"] is None


def test_a_flat_queue_is_steady_and_energy_per_token_is_exact():
    srv = _server([1.0, 0.0] * 20 + [0.0])
    # 700 W over the load [0.5, 9.5] s: the window runs from the sample before the first send
    # (t=0) to the one after the last answer (t=10): 7,000 J for 950 tokens
    out = summarize(srv, _gpu(700.0, 12), sent=_reqs(10, 9.0, 0.5), t_end_s=9.6,
                    output_tokens=950)
    assert out["steadiness"]["status"] == "steady", out["steadiness"]["reason"]
    assert out["above_saturation"] is False
    assert out["energy"]["joules"] == pytest.approx(7000.0)
    assert out["energy"]["source"] == "counter" and out["energy"]["mean_power_w"] == 700.0
    assert out["j_per_output_token"] == pytest.approx(7000 / 950)
    assert out["output_tokens_per_j"] == pytest.approx(950 / 7000)
    assert out["throttle_reasons"] == {}  # sampled, none seen


def test_throttling_is_named_with_its_share_of_samples():
    out = summarize(_server([0.0] * 41), _gpu(650.0, 10, throttle=0x4 | 0x1),
                    sent=_reqs(10, 9.0, 0.5), t_end_s=9.6, output_tokens=900)
    assert out["throttle_reasons"] == {"0": {"sw_power_cap": 1.0}}  # idle is no slowdown


def test_a_short_scrape_series_falls_back_to_the_clients_in_flight_count():
    # 3 scrapes over a 3-s load cannot be trend-tested; the client's in-flight count can: sent
    # 30/s, answered after a service time that grows by 0.1 s per request (a growing backlog)
    srv = _server([0.0, 5.0, 9.0], dt=1.0)
    reqs = [(i / 30, i / 30 + 0.1 * i, 50.0) for i in range(90)]
    out = summarize(srv, GpuSeries(interval_s=1.0, status="n/a"), sent=reqs, t_end_s=12.0,
                    output_tokens=None)
    st = out["steadiness"]
    assert st["queue_source"] == "client_in_flight"
    assert st["status"] == "above_saturation", st["reason"]


def test_a_burst_sent_at_once_is_too_short_to_judge():
    reqs = [(0.001 * i, 3.0, 50.0) for i in range(100)]  # rate=inf: 100 requests in 0.1 s
    out = summarize(_server([0.0] * 13), GpuSeries(interval_s=1.0, status="n/a"), sent=reqs,
                    t_end_s=3.0, output_tokens=None)
    assert out["steadiness"]["status"] == "too_short"
    assert "no time axis" in out["steadiness"]["reason"]
    assert out["above_saturation"] is False


def test_the_sampler_stand_in_feeds_energy_through_the_real_sampler():
    # the real GpuSampler over FakeNVML's 300-W GPU 0 and its counter-less GPU 1: the window's
    # total is None (a partial sum would read low) and the status stays "ok"
    from servelab.telemetry.gpu import GpuSampler

    with GpuSampler(interval_s=0.05, nvml=FakeNVML()) as smp:
        import time

        time.sleep(0.3)
    out = summarize(_server([0.0] * 13), smp.series, sent=_reqs(10, 0.2, 0.05, start=0.0),
                    t_end_s=0.3, output_tokens=10)
    assert out["telemetry"]["gpu_status"] == "ok"
    assert out["energy"] is None  # GPU 1 has neither counter nor power
    assert out["throttle_reasons"] == {"0": {"sw_power_cap": 1.0, "hw_thermal_slowdown": 1.0}}


def test_the_engines_prefix_cache_hit_rate_over_the_load_point():
    from servelab.telemetry.point import prefix_hit_rate

    s = ServerSeries(url="http://x/metrics", interval_s=1.0)
    # counters (vLLM's, the embedded engine's): 300 of the 1,000 tokens looked up in the load
    # point were found; what the counters held before it does not count
    for i, (q, h) in enumerate([(5000, 4000), (5400, 4100), (6000, 4300)]):
        s.add(float(i), {"prefix_cache_queries": q, "prefix_cache_hits": h,
                         "prefix_cache_hit_rate_gauge": None})
    assert prefix_hit_rate(s) == (pytest.approx(0.3), "counters")
    g = ServerSeries(url="http://x/metrics", interval_s=1.0)
    for i, rate in enumerate([0.5, 0.7, None]):   # SGLang's gauge: its mean
        g.add(float(i), {"prefix_cache_hit_rate_gauge": rate})
    assert prefix_hit_rate(g) == (pytest.approx(0.6), "gauge")
    assert prefix_hit_rate(_server([1.0, 2.0])) == (None, None)


def test_a_steady_points_hit_rate_is_its_measured_spans_alone():
    # scrapes every second; the warm-up (0-6 s) hits 90% of its lookups (a pool cycling), the
    # measured span (6-9 s, first send to last answer) 10%: its rate is the scrapes' inside it
    s = ServerSeries(url="http://x/metrics", interval_s=1.0)
    q = h = 0.0
    for i in range(11):
        s.add(float(i), {"prefix_cache_queries": q, "prefix_cache_hits": h})
        q, h = q + 1000, h + (100 if 6 <= i < 9 else 900)
    nogpu = GpuSeries(interval_s=1.0, status="n/a: no NVIDIA GPU")
    sent = _reqs(10, 2.0, 0.5, start=6.0)
    whole = summarize(s, nogpu, sent=sent, t_end_s=9.0)
    assert whole["prefix_cache_hit_rate"] == pytest.approx(0.66)  # an ordinary point: all
    out = summarize(s, nogpu, sent=sent, t_end_s=9.0, measured_span=True)
    assert out["prefix_cache_hit_rate"] == pytest.approx(0.1)
    assert out["prefix_cache_hit_rate_source"] == "counters"
    # one scrape inside the span: no rate, never the warm-up's
    short = summarize(s, nogpu, sent=_reqs(10, 0.3, 0.1, start=6.2), t_end_s=7.1,
                      measured_span=True)
    assert short["prefix_cache_hit_rate"] is None


def test_background_ttfts_are_in_a_steady_points_ttft_trend():
    # the real PointTelemetry (its scraper finds nothing on a closed port): a warm-up at 20
    # req/s from 0 s, every 5th answer failed, 40 measured requests from 3 s, a cool-down after
    import socket
    import time

    from servelab.telemetry.point import PointTelemetry, Sent

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    tel = PointTelemetry(f"http://127.0.0.1:{port}/metrics", 0.05).start()
    time.sleep(0.1)
    t0 = tel.perf0_ns

    def at(s: float) -> int:
        return t0 + int(s * 1e9)

    warm = [Sent(at(i / 20), at(i / 20 + 0.2), None if i % 5 == 4 else 40.0 + i % 3)
            for i in range(60)]
    measured = [Sent(at(3 + i / 20), at(3 + i / 20 + 0.2), 41.0) for i in range(40)]
    cool = [Sent(at(5 + i / 20), at(5 + i / 20 + 0.2), 42.0) for i in range(4)]
    start_s = 1.5  # where the warm-up's steady window began
    _, out = tel.finish(measured, at(5.2), None, [*warm, *cool], at(start_s),
                        measured_span=True)
    last = 3 + 39 / 20
    answered = sum(1 for r in (*warm, *measured, *cool) if r.ttft_ms is not None
                   and at(start_s) <= r.t_start_ns <= at(last))
    assert answered == 24 + 40
    assert out["steadiness"]["trends"]["ttft_ms"]["n"] == answered


def test_a_steady_points_energy_per_token_counts_every_token_the_gpu_served():
    """Inside a steady load the GPU also serves the warm-up's and cool-down's requests: J/token
    is the window's joules over the server's tokens in that window (its counter, 400 tok/s
    here), not over the measured requests' 950 tokens. 700 W / 400 tok/s = 1.75 J/tok."""
    srv = _server([1.0, 0.0] * 24 + [0.0])  # 12 s, the counter at 400 tok/s (100 per 0.25 s)
    kw = dict(sent=_reqs(10, 9.0, 0.5, start=1.5), t_end_s=10.6, output_tokens=950)
    out = summarize(srv, _gpu(700.0, 12), measured_span=True, **kw)
    assert out["energy"]["output_tokens"] == 400 * 10  # GPU samples at 1 s and 11 s
    assert out["energy"]["output_tokens_source"] == "server_counter"
    assert out["j_per_output_token"] == pytest.approx(700.0 / 400.0)
    # an ordinary point: the client's own count (the window spans its whole load)
    plain = summarize(srv, _gpu(700.0, 12), **kw)
    assert plain["energy"]["output_tokens"] == 950
    assert plain["energy"]["output_tokens_source"] == "client"
    # a server that counts no tokens: no denominator, so no J/token (never a wrong one)
    quiet = ServerSeries(url="http://x/metrics", interval_s=0.25)
    for i in range(49):
        quiet.add(i * 0.25, {"queued_requests": 0.0, "running_requests": 4.0})
    none = summarize(quiet, _gpu(700.0, 12), measured_span=True, **kw)
    assert none["energy"]["joules"] == pytest.approx(7000.0) and none["j_per_output_token"] is None
