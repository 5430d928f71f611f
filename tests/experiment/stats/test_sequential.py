"""The adaptive stopping rule: streams with a known effect decide the right way, A/A streams
stop as 'no change' or stay undecided, and peeking after every block keeps the error rate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servelab.experiment.stats import sequential as seq
from servelab.experiment.stats.analysis import analyze
from servelab.experiment.stats.runs import RunValue


def _streams(rng, n_streams, n, log_effect, sd, df=None):
    """Per-block log ratios: Gaussian, or Student-t with `df` (heavy tails) scaled to `sd`."""
    if df is None:
        noise = rng.normal(0.0, sd, (n_streams, n))
    else:
        noise = rng.standard_t(df, (n_streams, n)) * sd / math.sqrt(df / (df - 2))
    return log_effect + noise


def test_gaussian_familywise_coverage_holds_despite_a_look_after_every_block():
    # independent of the calibration's own simulation: another seed, another effect and scale
    design = seq.Design(min_n=4, max_n=12, alpha=0.10)
    rng = np.random.default_rng(123)
    x = _streams(rng, 2000, 12, math.log(1.37), 0.2)
    missed = 0
    for row in x:
        b = seq.confidence_sequence(row, design, band=0.0)
        missed += not (b.ci_low <= 1.37 <= b.ci_high)
    # nominal 10%; binomial sd at n=2000 is 0.7%: 3 sd either side
    assert 0.079 <= missed / 2000 <= 0.121, missed


def test_known_effect_streams_decide_the_right_way():
    design = seq.Design(min_n=5, max_n=15, alpha=0.05, effects=3)
    rng = np.random.default_rng(7)
    up = [seq.confidence_sequence(r, design, 0.02, True) for r in _streams(rng, 300, 15, 0.26, 0.1)]
    assert sum(b.verdict == seq.BETTER for b in up) >= 0.95 * 300
    assert not any(b.verdict == seq.WORSE for b in up)
    assert all(b.decided_at is None or 5 <= b.decided_at <= 15 for b in up)
    # the same ratios on a metric where lower is better (latency) are a regression
    down = [
        seq.confidence_sequence(r, design, 0.02, False) for r in _streams(rng, 300, 15, 0.26, 0.1)
    ]
    assert sum(b.verdict == seq.WORSE for b in down) >= 0.95 * 300
    assert not any(b.verdict == seq.BETTER for b in down)


def test_aa_streams_stop_as_no_change_or_stay_undecided():
    design = seq.Design(min_n=5, max_n=20, alpha=0.05)
    rng = np.random.default_rng(11)
    # heavy-tailed machine noise (t with 3 degrees of freedom), 10% per pair
    heavy = [seq.confidence_sequence(r, design, 0.02) for r in _streams(rng, 1000, 20, 0.0, 0.1, 3)]
    wrong = sum(b.verdict in (seq.BETTER, seq.WORSE) for b in heavy)
    assert wrong <= 0.05 * 1000, wrong
    assert {b.verdict for b in heavy} <= {seq.NO_CHANGE, seq.UNDECIDED, seq.BETTER, seq.WORSE}
    # a quiet machine: 0.3% per pair, band 2%: the rule decides there is no change, early
    quiet = [seq.confidence_sequence(r, design, 0.02) for r in _streams(rng, 200, 20, 0.0, 0.003)]
    assert all(b.verdict == seq.NO_CHANGE for b in quiet)
    assert max(b.decided_at for b in quiet) <= 6


def test_a_decision_never_reverses_as_blocks_arrive():
    design = seq.Design(min_n=5, max_n=20, alpha=0.05)
    rng = np.random.default_rng(3)
    for row in _streams(rng, 50, 20, 0.1, 0.1, 3):
        final = seq.confidence_sequence(row, design, 0.02)
        if final.decided_at is None:
            continue
        for n in range(final.decided_at, 21):
            assert seq.confidence_sequence(row[:n], design, 0.02).verdict == final.verdict
        assert seq.confidence_sequence(row[: final.decided_at - 1], design, 0.02).verdict == (
            seq.UNDECIDED
        )


def test_too_few_blocks_is_undecided_and_the_level_is_cached():
    design = seq.Design(min_n=5, max_n=10)
    b = seq.confidence_sequence([0.3, 0.31, 0.29, 0.3], design, 0.02)
    assert b.verdict == seq.UNDECIDED and math.isnan(b.ci_low) and b.n == 4
    assert 0 < design.gamma < design.alpha  # stricter than one look at alpha
    with pytest.raises(ValueError):
        seq.boundary_constant(1, 5, 0.05, "pocock")


def test_analyze_uses_the_sequence_for_every_directional_metric():
    runs = []
    for b in range(8):
        f = 1.0 + 0.01 * ((b * 7) % 5 - 2)
        runs.append(
            RunValue(
                "a", "c=1", b, b, {"output_throughput_tok_s": 100 * f, "tpot_ms": {"median": 10}}
            )
        )
        runs.append(
            RunValue(
                "b", "c=1", b, b, {"output_throughput_tok_s": 150 / f, "tpot_ms": {"median": 7 * f}}
            )
        )
    an = analyze(runs, baseline="a", arms=["a", "b"], load_keys=["c=1"], design=seq.Design(5, 10))
    e = an.effects[("b", "c=1", "output_throughput_tok_s")]
    assert e.rule == "sequential" and e.verdict == "better" and e.decided_at == 5
    assert e.ci_low < 1.5 < e.ci_high
    assert an.effects[("b", "c=1", "tpot_ms")].verdict == "better"
    assert an.effects[("b", "c=1", "accept_length")].verdict == "n/a"
    assert not any("repetition(s)" in w for w in an.warnings)  # no fixed-n warning


def test_obrien_fleming_coverage_holds_and_its_levels_rise_to_the_last_look():
    # the O'Brien-Fleming shape: strict early looks, the last close to a fixed-n interval; the
    # familywise coverage is checked by its own simulation (another seed and scale), and the
    # boundary is written out from its definition with scipy's t and normal quantiles
    from scipy import stats as sps

    d = seq.Design(min_n=4, max_n=12, alpha=0.10, shape="obrien-fleming")
    levels = [d.level(n) for n in range(4, 13)]
    assert all(a < b for a, b in zip(levels, levels[1:], strict=False))
    c = -sps.norm.ppf(levels[-1] / 2)  # the normal-scale constant at the last look
    for n in range(4, 13):
        assert d.t_bound(n) == pytest.approx(
            sps.t.ppf(sps.norm.cdf(c * math.sqrt(12 / n)), n - 1), rel=1e-6
        )
    pocock = seq.Design(min_n=4, max_n=12, alpha=0.10)
    assert d.t_bound(12) < pocock.t_bound(12) and d.t_bound(4) > pocock.t_bound(4)
    rng = np.random.default_rng(321)
    x = _streams(rng, 2000, 12, math.log(0.8), 0.15)
    missed = sum(
        not (b.ci_low <= 0.8 <= b.ci_high)
        for b in (seq.confidence_sequence(row, d, band=0.0) for row in x)
    )
    assert 0.079 <= missed / 2000 <= 0.121, missed  # nominal 10%, 3 binomial sd either side


def test_the_pocock_shape_keeps_its_constant_level():
    d = seq.Design(min_n=4, max_n=12, alpha=0.025)
    assert {round(d.level(n), 12) for n in range(4, 13)} == {round(d.gamma, 12)}
    # Pocock's level calibrated directly, by its own simulation (another seed): the alpha
    # quantile of each Gaussian experiment's smallest t-test p-value over looks 4..12
    from scipy.special import stdtr

    rng = np.random.default_rng(2024)
    z = rng.standard_normal((40_000, 12))
    n = np.arange(1, 13)
    mean = np.cumsum(z, axis=1) / n
    sd = np.sqrt((np.cumsum(z * z, axis=1) - n * mean * mean) / np.maximum(n - 1, 1))
    p = 2 * stdtr(n[3:] - 1, -np.abs(mean[:, 3:]) / (sd[:, 3:] / np.sqrt(n[3:])))
    assert d.gamma == pytest.approx(float(np.quantile(p.min(axis=1), 0.025)), rel=0.08)
    with pytest.raises(ValueError, match="unknown boundary"):
        seq.boundary_constant(4, 12, 0.05, "haybittle")


def test_secondary_load_points_are_not_waited_for_and_keep_their_own_alpha():
    from servelab.experiment.stats.analysis import headline, undecided

    runs = []
    rng = np.random.default_rng(5)
    for b in range(6):
        for lk, gain, sd in (("c=1", 1.3, 0.02), ("c=16", 1.0, 0.3)):
            a_v, b_v = (100 * math.exp(rng.normal(0, sd)) for _ in range(2))
            runs.append(RunValue("a", lk, b, b, {"output_throughput_tok_s": a_v}))
            runs.append(RunValue("b", lk, b, b, {"output_throughput_tok_s": b_v * gain}))
    both = seq.Design(4, 10, 0.05, effects=2)
    only = seq.Design(4, 10, 0.05, effects=1, primary=("c=1",))
    an_both = analyze(runs, baseline="a", arms=["a", "b"], load_keys=["c=1", "c=16"], design=both)
    an_only = analyze(runs, baseline="a", arms=["a", "b"], load_keys=["c=1", "c=16"], design=only)
    m = "output_throughput_tok_s"
    assert undecided(an_both, m) == [("b", "c=16")]  # the noisy point holds the stop back
    assert undecided(an_only, m) == []  # ... unless it is secondary
    # the primary interval is narrower without the Bonferroni split; the secondary one is the
    # interval of a one-effect design
    w = {k: an.effects[("b", "c=1", m)] for k, an in (("both", an_both), ("only", an_only))}
    assert w["only"].ci_high / w["only"].ci_low < w["both"].ci_high / w["both"].ci_low
    sec = an_only.effects[("b", "c=16", m)]
    alone = analyze(
        [r for r in runs if r.load_key == "c=16"],
        baseline="a",
        arms=["a", "b"],
        load_keys=["c=16"],
        design=seq.Design(4, 10, 0.05, effects=1),
    ).effects[("b", "c=16", m)]
    assert (sec.ci_low, sec.ci_high) == (alone.ci_low, alone.ci_high)
    # shown, never called: no verdict, and the headline says so
    assert sec.verdict == seq.SECONDARY and sec.decided_at is None
    assert alone.verdict != seq.SECONDARY
    assert an_only.effects[("b", "c=1", m)].verdict == seq.BETTER
    (line,) = headline(an_only, m)
    assert "at c=16 (secondary: no verdict)" in line and "at c=1 (better)" in line
