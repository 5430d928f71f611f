"""The bootstrap and the verdict rule, one copy of each for every effect an experiment states
(stats/analysis.py per metric, stats/capacity.py on SLO capacity, stats/sequential.py under
adaptive repetitions) and for `servelab compare`.

Intervals are percentile bootstraps, expanded for small samples (Hesterberg 2015), and with
fewer than MIN_REPS_TO_DECIDE pairs widened to at least the Student-t interval of the mean log
ratio (`t_interval`): a bootstrap cannot reach beyond the observed ratios. A change is called
only when the whole interval lies beyond the noise band in one direction (`rule`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MIN_REPS_TO_DECIDE = 5  # below: the bootstrap CI rests on too few distinct resamples


def expanded_alpha(n: int, conf: float = 0.95) -> float:
    """Two-sided tail mass for an expanded percentile bootstrap (Hesterberg 2015): the plain
    percentile interval is too narrow for small n (covers 84% at n=5, 89% at n=10 for a nominal
    95%); using z = sqrt(n/(n-1)) * t_{n-1} instead of z restores ~92% and ~94%."""
    from scipy import stats as sps

    if n < 2:
        return 1.0 - conf
    t = sps.t.ppf(1 - (1 - conf) / 2, n - 1)
    return float(2 * sps.norm.sf(math.sqrt(n / (n - 1)) * t))


def t_interval(logs: np.ndarray, conf: float = 0.95) -> tuple[float, float]:
    """The Student-t interval of the mean of `logs` (at least 2 values), as ratios: the floor
    of a small sample's interval (at n=3 a paired bootstrap covers only ~76%)."""
    from scipy import stats as sps

    n = logs.size
    half = sps.t.ppf(1 - (1 - conf) / 2, n - 1) * logs.std(ddof=1) / math.sqrt(n)
    return math.exp(logs.mean() - half), math.exp(logs.mean() + half)


def bootstrap_ratio(
    base: Sequence[float],
    arm: Sequence[float],
    *,
    paired: bool,
    n_boot: int = 10_000,
    conf: float = 0.95,
    seed: int = 0,
    expand: bool = True,
) -> tuple[float, float, float]:
    """(ratio, CI low, CI high) of arm over base, percentile bootstrap (expanded for small
    samples unless `expand` is False).

    Paired: `base[i]` and `arm[i]` come from the same block; the ratio is the geometric mean of
    arm[i]/base[i] and blocks are resampled; with fewer than 5 pairs the CI is widened to at least
    the Student-t interval of the mean log ratio (a bootstrap cannot reach beyond the observed
    ratios: at n=3 it covers only ~76%). Unpaired: the ratio of medians, each side resampled on
    its own. NaNs are dropped (pairwise when paired). CI is NaN with fewer than 2 values."""
    b, a = np.asarray(base, float), np.asarray(arm, float)
    rng = np.random.default_rng(seed)
    alpha = (1.0 - conf) / 2.0
    if paired:
        if b.shape != a.shape:
            raise ValueError("paired samples need equal lengths")
        keep = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
        logr = np.log(a[keep] / b[keep])
        if logr.size == 0:
            return math.nan, math.nan, math.nan
        point = float(np.exp(logr.mean()))
        if logr.size < 2:
            return point, math.nan, math.nan
        idx = rng.integers(0, logr.size, size=(n_boot, logr.size))
        boots = np.exp(logr[idx].mean(axis=1))
        if expand:
            alpha = expanded_alpha(logr.size, conf) / 2.0
        lo, hi = np.quantile(boots, [alpha, 1.0 - alpha])
        if expand and logr.size < MIN_REPS_TO_DECIDE:
            t_lo, t_hi = t_interval(logr, conf)
            lo, hi = min(lo, t_lo), max(hi, t_hi)
        return point, float(lo), float(hi)
    else:
        b, a = b[np.isfinite(b)], a[np.isfinite(a)]
        if b.size == 0 or a.size == 0 or np.median(b) == 0:
            return math.nan, math.nan, math.nan
        point = float(np.median(a) / np.median(b))
        if min(a.size, b.size) < 2:
            return point, math.nan, math.nan
        mb = np.median(b[rng.integers(0, b.size, size=(n_boot, b.size))], axis=1)
        ma = np.median(a[rng.integers(0, a.size, size=(n_boot, a.size))], axis=1)
        boots = ma / mb
        if expand:
            alpha = expanded_alpha(min(a.size, b.size), conf) / 2.0
    lo, hi = np.quantile(boots, [alpha, 1.0 - alpha])
    return point, float(lo), float(hi)


def bootstrap_median_ci(
    values: Sequence[float], n_boot: int = 5_000, conf: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of the median (NaN for fewer than 2 values)."""
    v = np.asarray([x for x in values if math.isfinite(x)], float)
    if v.size < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    meds = np.median(v[rng.integers(0, v.size, size=(n_boot, v.size))], axis=1)
    lo, hi = np.quantile(meds, [(1 - conf) / 2, 1 - (1 - conf) / 2])
    return float(lo), float(hi)


def rule(lo: float, hi: float, band: float, higher_is_better: bool | None, *, inside: str,
         across: str, missing: str) -> str:
    """The verdict rule: better / worse when the whole interval [lo, hi] of a ratio lies beyond
    the noise band (better: in the metric's good direction), `inside` when it lies wholly within
    the band, `across` when it crosses an edge of it, `missing` without an interval (NaN);
    n/a for a descriptive metric. Callers name the outcomes in their own words (`verdict`,
    sequential.decide, capacity.compare)."""
    if higher_is_better is None:
        return "n/a"
    if math.isnan(lo) or math.isnan(hi):
        return missing
    up, down = lo > 1.0 + band, hi < 1.0 - band
    if up or down:
        return "better" if up == higher_is_better else "worse"
    if lo >= 1.0 - band and hi <= 1.0 + band:
        return inside
    return across


def verdict(ratio: float, lo: float, hi: float, band: float, higher_is_better: bool | None) -> str:
    """better / worse when the whole CI lies beyond the noise band, else within noise."""
    if higher_is_better is not None and math.isnan(ratio):
        return "too few runs"
    return rule(lo, hi, band, higher_is_better, inside="within noise", across="within noise",
                missing="too few runs")
