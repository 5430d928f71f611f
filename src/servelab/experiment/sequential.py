"""Adaptive repetitions: a confidence sequence for a paired effect, valid however often it is
looked at, and the decision it supports.

Why a confidence sequence and not a fixed-n interval: with `repetitions = "auto"` the runner looks
at the effect after every block and stops as soon as it is decided. A 95% interval recomputed at
every look would exclude the truth at *some* look far more often than 5% of the time (the
peeking problem). Here the interval at look n (n paired blocks, min_n <= n <= max_n) is

    mean(log ratio) +- t_{n-1}(1 - gamma/2) * sd(log ratio) / sqrt(n)

with ONE nominal level gamma for every look, chosen so that, for Gaussian log ratios of any mean
and variance, all the intervals from min_n to max_n cover the true effect at once with
probability 1 - alpha (a repeated-t group-sequential design with Pocock's constant nominal
level). The t statistic is free of the mean and variance, so gamma depends only on
(min_n, max_n, alpha) and is found once by a seeded simulation. The running intersection of
the intervals is then also a (1 - alpha) confidence sequence, and it only shrinks: a decision
once reached never reverses. Several primary effects
(load points, arms) share alpha by Bonferroni, so the chance that ANY of them is called wrongly
stays below alpha. docs/EXPERIMENTS.md gives the measured error rates under heavy-tailed,
drifting, bursty noise (benchmarks/bench_noise_sim.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RULE = "repeated-t confidence sequence (Pocock constant nominal level, Bonferroni over effects)"

# verdicts of an adaptive experiment
BETTER, WORSE, NO_CHANGE, UNDECIDED = "better", "worse", "no change", "undecided"

_SIMS = 100_000  # Monte Carlo error of gamma at alpha = 0.05/3: about +-3% of gamma


@functools.lru_cache(maxsize=64)
def nominal_level(min_n: int, max_n: int, alpha: float, seed: int = 0) -> float:
    """The per-look two-sided level gamma with P(some look n in [min_n, max_n] has a t-test
    p-value < gamma) = alpha for i.i.d. Gaussian data (Pocock's constant nominal level; the t
    statistic makes it free of the mean and variance). Deterministic: seeded simulation."""
    from scipy.special import stdtr

    if not 2 <= min_n <= max_n:
        raise ValueError(f"need 2 <= min_n <= max_n, got {min_n}, {max_n}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    rng = np.random.default_rng(seed)
    n = np.arange(1, max_n + 1)
    best_p = np.empty(_SIMS)
    chunk = max(1_000, 2_000_000 // max_n)  # ~16 MB of normals per step, whatever max_n
    for start in range(0, _SIMS, chunk):
        z = rng.standard_normal((min(chunk, _SIMS - start), max_n))
        mean = np.cumsum(z, axis=1) / n
        var = (np.cumsum(z * z, axis=1) - n * mean * mean) / np.maximum(n - 1, 1)
        t = np.abs(mean) / np.sqrt(np.maximum(var, 1e-300) / n)
        p = 2 * stdtr(n[min_n - 1 :] - 1, -t[:, min_n - 1 :])
        best_p[start : start + z.shape[0]] = p.min(axis=1)
    return float(np.quantile(best_p, alpha))


@functools.lru_cache(maxsize=4096)
def boundary(n: int, gamma: float) -> float:
    """|t| boundary at a look with n pairs: the t_{n-1} quantile of the nominal level."""
    from scipy import stats as sps

    return float(sps.t.ppf(1 - gamma / 2, n - 1))


@dataclass(frozen=True, slots=True)
class Design:
    """The stopping rule of one experiment: looks after min_n..max_n pairs, familywise alpha
    shared by `effects` primary effects."""

    min_n: int
    max_n: int
    alpha: float = 0.05
    effects: int = 1

    @property
    def alpha_each(self) -> float:
        return self.alpha / max(self.effects, 1)

    @property
    def gamma(self) -> float:
        """The nominal two-sided level of each look."""
        return nominal_level(self.min_n, self.max_n, round(self.alpha_each, 12))


@dataclass(frozen=True, slots=True)
class Bound:
    """The confidence sequence of one effect after the pairs seen so far (ratios, not logs)."""

    n: int  # pairs used
    ratio: float  # geometric mean of the per-pair ratios
    ci_low: float  # running intersection of the looks' intervals (NaN before min_n pairs)
    ci_high: float
    decided_at: int | None  # pairs at the first look that decided, None if undecided
    verdict: str  # the decision at decided_at (kept thereafter), else undecided


def decide(lo: float, hi: float, band: float, higher_is_better: bool | None) -> str:
    """better / worse: the interval wholly beyond the band; no change: wholly inside it."""
    if higher_is_better is None:
        return "n/a"
    if math.isnan(lo) or math.isnan(hi):
        return UNDECIDED
    up, down = lo > 1.0 + band, hi < 1.0 - band
    if up or down:
        return BETTER if up == higher_is_better else WORSE
    if lo >= 1.0 - band and hi <= 1.0 + band:
        return NO_CHANGE
    return UNDECIDED


def confidence_sequence(
    log_ratios: Sequence[float], design: Design, band: float, higher_is_better: bool | None = True
) -> Bound:
    """Evaluate every look from min_n to len(log_ratios) (capped at max_n) in order; the
    interval is the running intersection. NaN/inf values must be dropped by the caller."""
    x = np.asarray(log_ratios, float)[: design.max_n]
    n_all = int(x.size)
    point = float(np.exp(x.mean())) if n_all else math.nan
    lo, hi = -math.inf, math.inf
    decided: int | None = None
    verdict = UNDECIDED
    gamma = design.gamma if n_all >= design.min_n else math.nan
    for n in range(design.min_n, n_all + 1):
        m, sd = float(x[:n].mean()), float(x[:n].std(ddof=1))
        half = boundary(n, gamma) * sd / math.sqrt(n)
        lo, hi = max(lo, m - half), min(hi, m + half)
        if lo > hi:  # the looks disagree (far from Gaussian data): keep the latest interval
            lo, hi = m - half, m + half
        if decided is None:
            v = decide(math.exp(lo), math.exp(hi), band, higher_is_better)
            if v not in (UNDECIDED, "n/a"):
                decided, verdict = n, v
    if n_all < design.min_n:
        return Bound(n_all, point, math.nan, math.nan, None, UNDECIDED)
    return Bound(n_all, point, math.exp(lo), math.exp(hi), decided, verdict)
