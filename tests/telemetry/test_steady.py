"""Steadiness on synthetic series whose truth is known by construction (seeded noise)."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.telemetry.steady import Online, SteadyConfig, assess, drain_start, reduce, trend

T = np.arange(0.0, 60.0, 0.5)  # a 60-s load point scraped every 0.5 s: 120 samples


def _noise(seed: int, scale: float, n: int = len(T)) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, scale, n)


def test_theil_sen_recovers_a_known_slope_and_mann_kendall_sees_it():
    y = 2.0 * T + 5.0 + _noise(0, 3.0)
    tr = trend(T, y)
    assert tr is not None and tr.direction == "up" and tr.p < 1e-6
    assert tr.slope_low <= 2.0 <= tr.slope_high and abs(tr.slope - 2.0) < 0.1
    down = trend(T, 100 - 1.5 * T + _noise(1, 3.0))
    assert down is not None and down.direction == "down" and abs(down.slope + 1.5) < 0.1


def test_noise_alone_is_flat_for_every_seed():
    """No trend by construction: at alpha = 0.01 and a 20% practical bar, 50 seeds all flat."""
    flats = [trend(T, 3.0 + _noise(s, 1.0)).direction for s in range(50)]
    assert flats == ["flat"] * 50


def test_a_significant_but_tiny_drift_is_not_a_trend():
    """+2% over the span: Mann-Kendall calls it significant, but it is below the 20% bar."""
    y = 100.0 + 2.0 * T / T[-1] + _noise(2, 0.1)
    tr = trend(T, y)
    assert tr.p < 1e-6 and tr.rel_change < 0.05 and tr.direction == "flat"


def test_missing_values_are_skipped_and_short_series_have_no_verdict():
    y = [None if i % 3 == 0 else 2.0 * t for i, t in enumerate(T)]
    tr = trend(T, y)
    assert tr.n == 80 and abs(tr.slope - 2.0) < 1e-9
    assert trend([0, 1, 2], [1, 2, 3]) is None
    assert trend(T, [None] * len(T)) is None
    assert trend(T, [4.0] * len(T)).direction == "flat"


def test_reduce_keeps_long_series_cheap_and_ordered():
    t = np.arange(10_000.0)
    rt, ry = reduce(t, 3 * t, 200)
    assert len(rt) == 200 and np.all(np.diff(rt) > 0) and np.allclose(ry, 3 * rt)


def test_a_steady_point_from_the_start():
    s = assess({"queue": (T, np.maximum(0, 3 + _noise(3, 1.0)).round()),
                "throughput": (T, 20 + _noise(4, 1.0))}, load_end_s=60.0)
    assert s.status == "steady" and s.warmup_end_s == 0.0 and s.drain_start_s == 60.0, s.reason


def test_the_warm_up_is_cut_where_the_ramp_ends():
    """The queue ramps 0 -> 6 over the first 12 s (20% of the span), then holds around 6; the
    throughput climbs with it. Steady from 12 s: the first candidate start at or after the ramp
    (steps of 6 s) that the test accepts is 12 or 18 s."""
    ramp = np.minimum(T / 12.0, 1.0)
    s = assess({"queue": (T, 6 * ramp + _noise(5, 0.5)),
                "throughput": (T, 20 * ramp + _noise(6, 0.5))}, load_end_s=60.0)
    assert s.status == "steady", s.reason
    assert s.warmup_end_s in (12.0, 18.0), s.reason
    assert "warm-up" in s.reason


def test_a_queue_growing_throughout_is_above_saturation():
    """Arrivals 1 req/s above the service rate: the queue grows ~1 req/s for the whole point."""
    q = np.maximum(0, T * 1.0 + _noise(7, 2.0))
    s = assess({"queue": (T, q), "throughput": (T, 10 + _noise(8, 0.5))}, load_end_s=60.0)
    assert s.status == "above_saturation", s.reason
    assert s.steady_span_s is None and 0.9 < s.trends["queue"].slope < 1.1
    assert "grows throughout" in s.reason


def test_a_queue_that_levels_off_is_not_above_saturation():
    """Grows for 20 s then holds (a finite backlog absorbed): a warm-up, not saturation."""
    q = np.minimum(T, 20.0) + _noise(9, 0.5)
    s = assess({"queue": (T, q)}, load_end_s=60.0)
    assert s.status == "steady" and s.warmup_end_s >= 18.0, s.reason


def test_throughput_decaying_throughout_is_unsteady():
    """The queue is flat but the throughput halves over the point (thermal throttling, say)."""
    s = assess({"queue": (T, 2 + _noise(10, 0.3)),
                "throughput": (T, 40 - T / 3 + _noise(11, 0.5))}, load_end_s=60.0)
    assert s.status == "unsteady" and "throughput down" in s.reason, s.reason


def test_per_request_ttft_rising_makes_it_unsteady():
    rng = np.random.default_rng(12)
    starts = np.sort(rng.uniform(0, 60, 500))
    ttft = 50 + 4 * starts + rng.normal(0, 10, 500)  # 50 -> 290 ms: a queue the scrape missed
    s = assess({"ttft_ms": (starts, ttft)}, load_end_s=60.0)
    assert s.status == "unsteady" and s.trends["ttft_ms"].direction == "up", s.reason


def test_the_drain_is_found_from_the_in_flight_count():
    """Closed loop at 8 streams until 50 s, then the last requests finish one by one."""
    inflight = np.where(T < 50, 8.0, np.maximum(0.0, 8 - (T - 50)))
    assert drain_start(T, inflight) == 50.0  # the last sample of the plateau (8 at 50 s)
    assert drain_start(T, np.full(len(T), 8.0)) is None  # never declines: no drain
    s = assess({"queue": (T, np.zeros(len(T)))}, in_flight=(T, inflight))
    assert s.status == "steady" and s.drain_start_s == 50.0


def test_too_few_samples_give_no_verdict():
    assert assess({"queue": ([0.0, 1.0], [0, 1])}).status == "too_short"
    assert assess({}).status == "too_short"


def test_settings_are_checked():
    with pytest.raises(AssertionError):
        SteadyConfig(alpha=0)


def _feed_until_steady(in_flight, ttft=None, cap_s=60.0, dt=0.1, check_s=0.5):
    """Feed an online detector a series sample by sample, as the warm-up would, asking every
    `check_s`; (declared at, verdict), or (None, the verdict at the cap)."""
    d = Online()
    t_check = 0.0
    for i, t in enumerate(np.arange(0.0, cap_s, dt)):
        d.add("in_flight", t, float(in_flight(t, i)))
        if ttft is not None:
            d.add("ttft_ms", t, float(ttft(t, i)))
        if t - t_check >= check_s:
            t_check = t
            v = d.check(t)
            if v is not None:
                return t, v
    return None, d.at_cap(cap_s)


def test_online_a_ramp_then_flat_is_declared_steady_after_the_ramp():
    rng = np.random.default_rng(7)
    noise = rng.normal(0.0, 1.5, 1000)
    # in flight: 0 -> 30 over 12 s, then 30 with noise; TTFT rises with it, then holds
    t_decl, v = _feed_until_steady(lambda t, i: max(0.0, min(t / 12.0, 1.0) * 30 + noise[i]),
                                   lambda t, i: 40 + 2 * min(t, 12.0) + noise[-i])
    assert v.status == "steady" and t_decl is not None, v.reason
    # nothing was called steady while the ramp went on; the window judged is the trailing
    # half, where what is left of the ramp is under the trend bar (20% of the level)
    assert 12.0 < t_decl <= 30.0 and v.warmup_end_s == pytest.approx(t_decl / 2), v.reason
    assert set(v.trends) == {"in_flight", "ttft_ms"}


def test_online_a_flat_load_is_steady_as_soon_as_the_window_allows():
    rng = np.random.default_rng(8)
    t_decl, v = _feed_until_steady(lambda t, i: rng.poisson(6))
    assert v.status == "steady" and t_decl == pytest.approx(2 * Online().min_window_s, abs=0.6)


def test_online_a_growing_queue_never_declares_and_hits_the_cap_above_saturation():
    rng = np.random.default_rng(9)
    t_decl, v = _feed_until_steady(lambda t, i: 2.0 * t + rng.normal(0.0, 3.0), cap_s=40.0)
    assert t_decl is None and v.status == "above_saturation", v.reason
    assert v.trends["in_flight"].direction == "up" and "40-s warm-up" in v.reason
    # the server's queue, when scraped, is judged too: flat in flight, growing queue
    d = Online(queue=lambda: (list(np.arange(0, 40.0, 1.0)), list(np.arange(0, 40.0, 1.0))))
    for t in np.arange(0.0, 40.0, 0.1):
        d.add("in_flight", t, 8.0 + rng.normal(0.0, 1.0))
    assert d.check(39.9) is None and d.at_cap(40.0).status == "above_saturation"
