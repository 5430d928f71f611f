"""SLO-capacity statistics (experiment/stats/capacity.py): the interval-arithmetic effect against
hand-computed bounds, honest open brackets."""

from __future__ import annotations

import math

import pytest

from servelab.experiment.stats import capacity
from servelab.experiment.stats.runs import RunValue


def _run(arm: str, block: int, status: str, lo: float | None, hi: float | None,
         sync: float = 1.0) -> RunValue:
    cap = {"status": status, "low_req_s": lo, "high_req_s": hi, "synchronous_req_s": sync,
           "slo_text": "ttft_p99_ms <= 2000"}
    return RunValue(arm, "capacity", block, block, {"capacity": cap})


def test_closed_brackets_give_the_interval_arithmetic_bounds():
    # identical blocks: every bootstrap resample is the same, so the CI is exactly the bounds
    # a_low / b_high and a_high / b_low, and the point the ratio of the bracket midpoints
    runs = [r for b in range(6) for r in (_run("base", b, "bracketed", 10.0, 11.0),
                                          _run("mtp", b, "bracketed", 20.0, 22.0))]
    e = capacity.compare(runs, "mtp", "base", 0.02, "capacity")
    assert e.n == 6 and e.open_blocks == 0
    assert e.ci_low == pytest.approx(20 / 11) and e.ci_high == pytest.approx(22 / 10)
    assert e.ratio == pytest.approx(math.sqrt(20 * 22) / math.sqrt(10 * 11))
    assert e.verdict == "better"
    assert e.sentence() == ("mtp raises SLO capacity under ttft_p99_ms <= 2000 by +100% "
                            "[+82%, +120%] (vs base)")


def test_noise_between_blocks_widens_the_interval_beyond_the_brackets():
    import numpy as np

    rng = np.random.default_rng(1)
    runs = []
    for b in range(8):
        s = float(rng.lognormal(0, 0.1))
        runs += [_run("base", b, "bracketed", 10.0, 10.5), _run("x", b, "bracketed", 12 * s, 12.6 * s)]
    e = capacity.compare(runs, "x", "base", 0.02, "capacity")
    assert e.ci_low < 12 / 10.5 * 0.97 and e.ci_high > 12.6 / 10 * 1.03
    assert e.ci_low < e.ratio < e.ci_high


def test_open_brackets_are_bounds_not_numbers():
    runs = [r for b in range(5) for r in (_run("base", b, "bracketed", 10.0, 11.0),
                                          _run("fast", b, "above_saturation", 30.0, None),
                                          _run("broken", b, "unmet_at_synchronous", 0.0, None, 2.0))]
    up = capacity.compare(runs, "fast", "base", 0.02, "capacity")
    assert math.isnan(up.ratio) and math.isinf(up.ci_high) and up.open_blocks == 5
    assert up.ci_low == pytest.approx(30 / 11) and up.verdict == "better"
    assert up.pct_text() == "[+173%, +inf]"
    assert up.sentence().startswith("fast raises SLO capacity under ttft_p99_ms <= 2000 by at "
                                    "least 173% (95% CI [+173%, +inf]; 5 of 5 blocks")
    down = capacity.compare(runs, "broken", "base", 0.02, "capacity")
    assert down.ci_low == 0.0 and down.ci_high == pytest.approx(2.0 / 10) and down.verdict == "worse"
    assert capacity.bracket_of(runs[1].summary).text() == ">= 30"
    assert capacity.bracket_of(runs[2].summary).text() == "< 2"
    # an open upper end that may fall below the band: the effect is not decided
    mixed = [r for b in range(5) for r in (_run("base", b, "bracketed", 10.0, 11.0),
                                           _run("m", b, "unresolved", None, 12.0))]
    assert capacity.compare(mixed, "m", "base", 0.02, "capacity").verdict == "inconclusive"


def test_same_capacity_is_within_noise_and_one_block_too_few():
    runs = [r for b in range(5) for r in (_run("a", b, "bracketed", 10.0, 10.05),
                                          _run("b", b, "bracketed", 10.0, 10.05))]
    assert capacity.compare(runs, "b", "a", 0.02, "capacity").verdict == "within noise"
    one = [_run("a", 0, "bracketed", 10.0, 11.0), _run("b", 0, "bracketed", 20.0, 22.0)]
    assert capacity.compare(one, "b", "a", 0.02, "capacity").verdict == "too few runs"
