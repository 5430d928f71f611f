"""The bootstrap and the verdict rule (experiment/stats/bootstrap.py) against independent
computations: scipy's bootstrap, closed forms, simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from servelab.experiment.stats import bootstrap as st


def _geo_mean_ratio(b, a, axis=-1):
    return np.exp(np.mean(np.log(a / b), axis=axis))


def test_paired_ci_matches_scipy_bootstrap():
    rng = np.random.default_rng(1)
    base = rng.lognormal(np.log(100), 0.05, 12)
    arm = base * rng.lognormal(np.log(1.3), 0.03, 12)  # true effect x1.3, paired noise
    ratio, lo, hi = st.bootstrap_ratio(base, arm, paired=True, n_boot=20_000, seed=3, expand=False)
    ref = sps.bootstrap(
        (base, arm),
        _geo_mean_ratio,
        paired=True,
        vectorized=True,
        n_resamples=20_000,
        method="percentile",
        random_state=7,
    )
    assert ratio == pytest.approx(float(np.exp(np.mean(np.log(arm / base)))), rel=1e-12)
    assert lo == pytest.approx(ref.confidence_interval.low, rel=3e-3)
    assert hi == pytest.approx(ref.confidence_interval.high, rel=3e-3)
    assert lo < 1.3 < hi or abs(ratio - 1.3) < 0.03


def test_unpaired_ratio_of_medians_and_scipy_ci():
    rng = np.random.default_rng(2)
    base = rng.normal(50, 2, 15)
    arm = rng.normal(40, 2, 11)
    ratio, lo, hi = st.bootstrap_ratio(base, arm, paired=False, n_boot=20_000, seed=5, expand=False)
    assert ratio == pytest.approx(np.median(arm) / np.median(base), rel=1e-12)

    def stat(b, a, axis=-1):
        return np.median(a, axis=axis) / np.median(b, axis=axis)

    ref = sps.bootstrap(
        (base, arm),
        stat,
        paired=False,
        vectorized=True,
        n_resamples=20_000,
        method="percentile",
        random_state=9,
    )
    assert lo == pytest.approx(ref.confidence_interval.low, rel=1e-2)
    assert hi == pytest.approx(ref.confidence_interval.high, rel=1e-2)


@pytest.mark.parametrize(("n", "lowest"), [(3, 0.92), (5, 0.88), (10, 0.90)])
def test_paired_ci_coverage_on_known_distribution(n, lowest):
    """95% CIs of the geometric-mean ratio cover the true ratio about 95% of the time, also at
    small n (the plain percentile bootstrap covers ~76% at n=3, ~84% at n=5, ~89% at n=10)."""
    rng = np.random.default_rng(4 + n)
    true, covered, trials = 1.2, 0, 400
    for t in range(trials):
        base = rng.lognormal(np.log(200), 0.1, n)
        arm = base * np.exp(rng.normal(np.log(true), 0.3, n))
        _, lo, hi = st.bootstrap_ratio(base, arm, paired=True, n_boot=2_000, seed=t)
        covered += lo <= true <= hi
    # binomial sd at 400 trials is ~1.1%: the bounds leave > 2 sd
    assert lowest <= covered / trials <= 0.995


def test_expanded_alpha_matches_hesterberg():
    # z = sqrt(n/(n-1)) * t_{n-1, 0.975}; at n=5: sqrt(5/4) * 2.7764 = 3.1041 -> 2 * sf = 0.00191
    assert st.expanded_alpha(5) == pytest.approx(
        2 * sps.norm.sf(np.sqrt(5 / 4) * sps.t.ppf(0.975, 4))
    )
    assert st.expanded_alpha(5) == pytest.approx(0.00191, abs=2e-5)
    assert st.expanded_alpha(10_000) == pytest.approx(0.05, abs=1e-3)


def test_paired_beats_unpaired_under_block_drift():
    """Drift shared by both arms of a block cancels when paired: the paired CI is narrower."""
    rng = np.random.default_rng(6)
    drift = rng.lognormal(0, 0.15, 8)  # machine speed per block
    base = 100 * drift * rng.lognormal(0, 0.01, 8)
    arm = 110 * drift * rng.lognormal(0, 0.01, 8)
    _, plo, phi = st.bootstrap_ratio(base, arm, paired=True)
    _, ulo, uhi = st.bootstrap_ratio(base, arm, paired=False)
    assert phi - plo < 0.5 * (uhi - ulo)
    assert plo > 1.02


@pytest.mark.parametrize(
    ("ratio", "lo", "hi", "higher", "want"),
    [
        (1.47, 1.41, 1.52, True, "better"),  # throughput up
        (1.47, 1.41, 1.52, False, "worse"),  # latency up
        (0.70, 0.65, 0.75, False, "better"),  # latency down
        (0.70, 0.65, 0.75, True, "worse"),
        (1.01, 0.97, 1.04, True, "within noise"),
        (1.05, 1.01, 1.09, True, "within noise"),  # CI reaches into the +-2% band: not called
        (1.05, math.nan, math.nan, True, "too few runs"),
        (1.05, 1.04, 1.06, None, "n/a"),
    ],
)
def test_verdict_direction_and_band(ratio, lo, hi, higher, want):
    assert st.verdict(ratio, lo, hi, 0.02, higher) == want
