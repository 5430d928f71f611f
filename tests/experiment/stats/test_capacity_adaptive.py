"""SLO capacity under adaptive repetitions (experiment/stats/capacity.py, analysis.undecided):
the always-valid interval of the bracket ends against a direct computation of the repeated-t
boundary, its coverage under peeking after every block, and a stopping rule that decides on
the capacity itself at a sweep's load key, not on the throughput at the point where capacity
was found."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from servelab.experiment.stats import capacity
from servelab.experiment.stats import sequential as seq
from servelab.experiment.stats.analysis import analyze, undecided
from servelab.experiment.stats.runs import RunValue


def _run(arm: str, block: int, lo: float | None, hi: float | None, tok_s: float = 100.0,
         status: str = "bracketed", sync: float = 1.0) -> RunValue:
    cap = {"status": status, "low_req_s": lo, "high_req_s": hi, "synchronous_req_s": sync,
           "slo_text": "tpot_median_ms <= 4.5"}
    return RunValue(arm, "capacity", block, block,
                    {"capacity": cap, "output_throughput_tok_s": tok_s})


def _hand_interval(lo: np.ndarray, hi: np.ndarray, d: seq.Design) -> tuple[float, float]:
    """The documented rule written out with scipy's t quantile: at every look n, the lower
    ends' mean - t * sd / sqrt(n) and the upper ends' mean + t * sd / sqrt(n), intersected."""
    low, high = -math.inf, math.inf
    for n in range(d.min_n, lo.size + 1):
        t = sps.t.ppf(1 - d.gamma / 2, n - 1)
        low = max(low, lo[:n].mean() - t * lo[:n].std(ddof=1) / math.sqrt(n))
        high = min(high, hi[:n].mean() + t * hi[:n].std(ddof=1) / math.sqrt(n))
    return math.exp(low), math.exp(high)


def test_adaptive_interval_is_the_repeated_t_bound_of_the_bracket_ends():
    d = seq.Design(min_n=4, max_n=10, alpha=0.05)
    rng = np.random.default_rng(3)
    runs, lo, hi = [], [], []
    for b in range(7):
        base = 10.0 * float(rng.lognormal(0, 0.08))
        arm = 16.0 * float(rng.lognormal(0, 0.08))
        runs += [_run("base", b, base, base * 1.08), _run("mtp", b, arm, arm * 1.06)]
        lo.append(math.log(arm / (base * 1.08)))
        hi.append(math.log(arm * 1.06 / base))
    e = capacity.compare(runs, "mtp", "base", 0.05, "capacity", design=d)
    want_lo, want_hi = _hand_interval(np.array(lo), np.array(hi), d)
    assert e.rule == "sequential" and e.n == 7
    assert e.ci_low == pytest.approx(want_lo, rel=1e-9)
    assert e.ci_high == pytest.approx(want_hi, rel=1e-9)
    assert e.verdict == "better" and e.decided_at is not None and e.decided_at >= d.min_n, e
    # the fixed-n bootstrap of the same runs is another interval (not always-valid)
    fixed = capacity.compare(runs, "mtp", "base", 0.05, "capacity")
    assert fixed.rule == "bootstrap" and fixed.ci_low != pytest.approx(e.ci_low)


def test_adaptive_interval_before_the_first_look_and_with_open_brackets():
    d = seq.Design(min_n=4, max_n=10, alpha=0.05)
    three = [r for b in range(3) for r in (_run("base", b, 10.0, 11.0), _run("m", b, 20.0, 21.0))]
    e = capacity.compare(three, "m", "base", 0.05, "capacity", design=d)
    assert e.verdict == "undecided" and math.isnan(e.ci_low)
    assert "not decided yet after 3 blocks" in e.sentence()
    # the baseline never meets the SLOs: its capacity is [0, synchronous rate), so the upper
    # end is open, and the lower end alone decides
    runs = [r for b in range(5) for r in (
        _run("base", b, 0.0, None, status="unmet_at_synchronous", sync=7.0 + 0.1 * b),
        _run("m", b, 12.0 + 0.2 * b, 13.0 + 0.2 * b))]
    e = capacity.compare(runs, "m", "base", 0.05, "capacity", design=d)
    assert math.isinf(e.ci_high) and math.isnan(e.ratio) and e.open_blocks == 5
    assert e.ci_low > 1.05 and e.verdict == "better"
    assert e.ci_low < min((12.0 + 0.2 * b) / (7.0 + 0.1 * b) for b in range(5))


def test_adaptive_interval_keeps_its_coverage_when_looked_at_after_every_block():
    # A/A sweeps: both arms' capacity drawn from one law, bracketed tightly (0.2%) around it, so
    # the bracket width cannot hide optional stopping (with 10% brackets even a naive 90% interval
    # recomputed at every look kept its misses under 10%). The true ratio 1 must lie in every
    # look's interval (familywise) in about 1 - alpha of the experiments; the naive interval
    # (nominal level alpha at each look) misses in about 23% here.
    d = seq.Design(min_n=4, max_n=10, alpha=0.10)
    rng = np.random.default_rng(11)
    missed = 0
    trials = 800
    for _ in range(trials):
        runs = []
        for b in range(10):
            for arm in ("a", "b"):
                c = 10.0 * float(rng.lognormal(0, 0.15))
                lo = c / (1 + 0.002 * float(rng.uniform()))  # the true capacity in the bracket
                runs.append(_run(arm, b, lo, lo * 1.002))
        e = capacity.compare(runs, "b", "a", 0.0, "capacity", design=d)
        missed += not (e.ci_low <= 1.0 <= e.ci_high)
    assert missed / trials <= 0.13, missed  # nominal 0.10; 0.13 is ~3 binomial sd above


def _values(cap_blocks: list[tuple[float, float]], tok: list[tuple[float, float]]
            ) -> list[RunValue]:
    out = []
    for b, ((cb, cm), (tb, tm)) in enumerate(zip(cap_blocks, tok, strict=True)):
        out += [_run("base", b, cb, cb * 1.05, tb), _run("mtp", b, cm, cm * 1.05, tm)]
    return out


def test_stopping_rule_decides_on_capacity_at_a_sweeps_load_key():
    d = seq.Design(min_n=4, max_n=10, alpha=0.05)
    # throughput at the capacity point clearly decided (+50% every block), capacity itself
    # all over the place: the experiment must go on
    runs = _values([(10, 8), (10, 25), (10, 6), (10, 30), (10, 9)],
                   [(100, 150), (100, 151), (100, 149), (100, 150), (100, 150)])
    an = analyze(runs, baseline="base", arms=["base", "mtp"], load_keys=["capacity"],
                 design=d, metrics=["output_throughput_tok_s"])
    assert an.effects[("mtp", "capacity", "output_throughput_tok_s")].verdict == "better"
    assert an.capacity["mtp"].verdict == "undecided"
    assert undecided(an, "output_throughput_tok_s") == [("mtp", "capacity")]
    # capacity +50% in every block, throughput undecided: the experiment may stop
    runs = _values([(10, 15), (10, 15.2), (10, 14.9), (10, 15.1), (10, 15)],
                   [(100, 60), (100, 170), (100, 90), (100, 210), (100, 100)])
    an = analyze(runs, baseline="base", arms=["base", "mtp"], load_keys=["capacity"],
                 design=d, metrics=["output_throughput_tok_s"])
    assert an.effects[("mtp", "capacity", "output_throughput_tok_s")].verdict == "undecided"
    assert an.capacity["mtp"].verdict == "better"
    assert undecided(an, "output_throughput_tok_s") == []


def test_fixed_repetitions_analysis_is_unchanged_by_sweeps():
    runs = _values([(10, 15)] * 5, [(100, 150)] * 5)
    an = analyze(runs, baseline="base", arms=["base", "mtp"], load_keys=["capacity"],
                 metrics=["output_throughput_tok_s"])
    # no stopping rule to feed: the analysis states the fixed-n CI (the report shows it as is)
    e = an.capacity["mtp"]
    assert an.design is None and e.rule == "bootstrap" and e.decided_at is None
    assert e == capacity.compare(runs, "mtp", "base", an.noise_band, "capacity")
    assert e.verdict == "better" and e.ci_low > 1 + an.noise_band, e
    assert [a.arm for a in an.capacity_arms] == ["base", "mtp"]


