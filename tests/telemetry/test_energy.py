"""Energy per token from GPU samples whose truth is known by construction."""

from __future__ import annotations

import pytest

from servelab.telemetry.energy import WRAP, gpu_joules, window
from servelab.telemetry.gpu import GpuSample, GpuSeries


def _s(t, gpu=0, e=None, p=None):
    return GpuSample(t, gpu, None, None, p, e, None, None, None, None)


def test_counter_delta_over_the_window():
    rows = [_s(t, e=1_000_000 + 250_000 * t) for t in range(11)]  # 250 W for 10 s
    assert gpu_joules(rows) == (2500.0, "counter")
    assert gpu_joules(rows, t_a=2, t_b=6) == (1000.0, "counter")  # [2, 6]: 4 s


def test_the_counter_wraps_at_2_to_the_64():
    start = WRAP - 100_000  # 100 J before the wrap
    rows = [_s(t, e=(start + 300_000 * t) % WRAP) for t in range(4)]  # 300 W
    assert gpu_joules(rows) == (pytest.approx(900.0), "counter")


def test_a_reset_counter_falls_back_to_power_for_that_interval():
    rows = [_s(0, e=9_000_000, p=200.0), _s(1, e=9_200_000, p=200.0),
            _s(2, e=50, p=200.0), _s(3, e=200_050, p=200.0)]  # driver reloaded at t=2
    j, src = gpu_joules(rows)
    assert j == pytest.approx(600.0) and src == "mixed"


def test_power_integrated_when_there_is_no_counter():
    rows = [_s(t, p=100.0 + 10 * t) for t in range(5)]  # 100 -> 140 W linearly over 4 s
    assert gpu_joules(rows) == (pytest.approx(480.0), "power")  # trapezoids are exact here


def test_neither_reading_is_none():
    assert gpu_joules([_s(0), _s(1)]) is None
    assert gpu_joules([_s(0, e=5)]) is None  # one sample is no interval


def test_window_sums_gpus_and_divides_by_tokens():
    series = GpuSeries(interval_s=1.0)
    series.samples = [_s(t, g, e=300_000 * t) for t in range(3) for g in (0, 1)]  # 2 x 300 W
    e = window(series, output_tokens=1200)
    assert e.joules == 1200.0 and e.seconds == 2.0 and e.mean_power_w == 600.0
    assert e.j_per_token == 1.0 and e.tokens_per_j == 1.0 and e.source == "counter"
    assert window(series, output_tokens=0).j_per_token is None  # no tokens: no ratio
    series.status = "n/a: no NVIDIA GPU"
    assert window(series, output_tokens=1200) is None
