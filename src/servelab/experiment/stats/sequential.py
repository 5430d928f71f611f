"""Adaptive repetitions: a confidence sequence for a paired effect, valid however often it is
looked at, and the decision it supports.

Why a confidence sequence and not a fixed-n interval: with `repetitions = "auto"` the runner looks
at the effect after every block and stops as soon as it is decided. A 95% interval recomputed at
every look would exclude the truth at *some* look far more often than 5% of the time (the
peeking problem). Here the interval at look n (n paired blocks, min_n <= n <= max_n) is

    mean(log ratio) +- t_{n-1}(1 - gamma_n/2) * sd(log ratio) / sqrt(n)

a repeated-t group-sequential design (repeated confidence intervals). The nominal level gamma_n
of look n follows a Wang-Tsiatis boundary shape: on the normal scale the boundary is
c * (n / max_n)^(Delta - 1/2), with Delta = 1/2 (Pocock: one constant level at every look) or
Delta = 0 (O'Brien-Fleming: strict early looks, the last look close to a fixed-n interval).
The constant c is chosen so that, for Gaussian log ratios of any mean and variance, all the
intervals from min_n to max_n cover the true effect at once with probability 1 - alpha. The t
statistic is free of the mean and variance, so c depends only on (min_n, max_n, alpha, shape)
and is found once by a seeded simulation. The running intersection of the intervals is then
also a (1 - alpha) confidence sequence, and it only shrinks: a decision once reached never
reverses.

Pocock stops a large effect earliest; O'Brien-Fleming decides more effects by the last look
(its final interval is narrower), so it suits a fixed time budget that most runs spend.
Several primary effects (load points, arms) share alpha by Bonferroni, so the chance that ANY
of them is called wrongly stays below alpha; `primary` names the load points whose effects are
primary (default: all). The others are secondary: shown with their own interval at alpha
(descriptive, outside the familywise guarantee), never given a verdict and never waited for.
docs/EXPERIMENTS.md gives the measured error rates under heavy-tailed, drifting, bursty noise
(benchmarks/bench_noise_sim.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from servelab.experiment.stats.bootstrap import rule

# boundary shapes: the Wang-Tsiatis Delta of each
BOUNDARIES = {"pocock": 0.5, "obrien-fleming": 0.0}
_SHAPE_TEXT = {"pocock": "Pocock constant", "obrien-fleming": "O'Brien-Fleming-shaped"}

# verdicts of an adaptive experiment
BETTER, WORSE, NO_CHANGE, UNDECIDED = "better", "worse", "no change", "undecided"
# an effect outside the primary load points: its interval is shown, no verdict is called
SECONDARY = "secondary"

_SIMS = 100_000  # Monte Carlo error of gamma at alpha = 0.05/3: about +-3% of gamma


@functools.lru_cache(maxsize=64)
def boundary_constant(min_n: int, max_n: int, alpha: float, shape: str, seed: int = 0) -> float:
    """The normal-scale constant c of a Wang-Tsiatis boundary: with z_n the normal quantile of
    look n's two-sided t-test p-value, P(some look n in [min_n, max_n] has z_n > c * (n /
    max_n)^(Delta - 1/2)) = alpha for i.i.d. Gaussian data. Deterministic: seeded simulation."""
    from scipy.special import ndtri, stdtr

    if shape not in BOUNDARIES:
        raise ValueError(f"unknown boundary {shape!r}; use one of {', '.join(BOUNDARIES)}")
    if not 2 <= min_n <= max_n:
        raise ValueError(f"need 2 <= min_n <= max_n, got {min_n}, {max_n}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    delta = BOUNDARIES[shape]
    rng = np.random.default_rng(seed)
    n = np.arange(1, max_n + 1)
    looks = n[min_n - 1 :]
    weight = (looks / max_n) ** (0.5 - delta)  # z_n * weight > c  <=>  z_n > c (n/N)^(D - 1/2)
    worst = np.empty(_SIMS)
    chunk = max(1_000, 2_000_000 // max_n)
    for start in range(0, _SIMS, chunk):
        z = rng.standard_normal((min(chunk, _SIMS - start), max_n))
        mean = np.cumsum(z, axis=1) / n
        var = (np.cumsum(z * z, axis=1) - n * mean * mean) / np.maximum(n - 1, 1)
        t = np.abs(mean) / np.sqrt(np.maximum(var, 1e-300) / n)
        half_p = stdtr(looks - 1, -t[:, min_n - 1 :])  # one-sided tail of |t|
        zq = -ndtri(np.maximum(half_p, 1e-300))
        worst[start : start + z.shape[0]] = (zq * weight).max(axis=1)
    return float(np.quantile(worst, 1 - alpha))


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
    effects: int = 1  # primary effects sharing alpha
    shape: str = "pocock"  # a key of BOUNDARIES
    primary: tuple[str, ...] | None = None  # load keys of the primary effects (None: all)

    @property
    def alpha_each(self) -> float:
        return self.alpha / max(self.effects, 1)

    @property
    def gamma(self) -> float:
        """The nominal two-sided level of the first look (Pocock: of every look)."""
        return self.level(self.min_n)

    def level(self, n: int) -> float:
        """The nominal two-sided level of the look after n pairs."""
        from scipy.special import ndtr

        c = boundary_constant(self.min_n, self.max_n, round(self.alpha_each, 12), self.shape)
        z = c * (min(n, self.max_n) / self.max_n) ** (BOUNDARIES[self.shape] - 0.5)
        return float(2 * ndtr(-z))

    def t_bound(self, n: int) -> float:
        """|t| boundary of the look after n pairs."""
        return boundary(n, self.level(n))

    def is_primary(self, load_key: str) -> bool:
        return self.primary is None or load_key in self.primary

    def secondary_keys(self, load_keys: Sequence[str]) -> list[str]:
        """The load keys of `load_keys` whose effects are secondary, in order."""
        return [k for k in load_keys if not self.is_primary(k)]

    def secondary(self) -> Design:
        """The design of a secondary effect: the same looks, alpha for itself alone."""
        return replace(self, effects=1)

    def levels_text(self) -> str:
        """'nominal level 0.0063' (Pocock) or 'nominal level 0.0002 at look 4 to 0.031 at look
        12' (a shape whose level changes)."""
        first, last = self.level(self.min_n), self.level(self.max_n)
        if self.shape == "pocock" or self.min_n == self.max_n:
            return f"nominal level {first:.2g}"
        return f"nominal level {first:.2g} at look {self.min_n} to {last:.2g} at look {self.max_n}"


def rule_text(design: Design) -> str:
    """The rule's name as the report and `run --check` print it."""
    return (
        f"repeated-t confidence sequence ({_SHAPE_TEXT[design.shape]} nominal level, "
        "Bonferroni over primary effects)"
    )


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
    """better / worse: the interval wholly beyond the band; no change: wholly inside it
    (bootstrap.rule, the one verdict rule)."""
    return rule(lo, hi, band, higher_is_better, inside=NO_CHANGE, across=UNDECIDED,
                missing=UNDECIDED)


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
    for n in range(design.min_n, n_all + 1):
        m, sd = float(x[:n].mean()), float(x[:n].std(ddof=1))
        half = design.t_bound(n) * sd / math.sqrt(n)
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
