"""Statistics of an experiment: per arm x load point x metric medians and spread, each arm's
effect against the baseline as a ratio with a bootstrap 95% CI, and a verdict against a noise band.

The unit of replication is one run. When the schedule pairs runs by block (interleaved or
shuffled blocks), the effect is the geometric mean of the per-block ratios arm/baseline and the
bootstrap resamples blocks; otherwise it is the ratio of medians and each arm is resampled on its
own. A change is called only when the whole CI lies beyond the noise band (default +-2%) in one
direction; "better" means higher for throughput and lower for latency.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from servelab.experiment.design.metrics import METRICS, metric_value
from servelab.experiment.design.sweep import SWEEP_KEY
from servelab.experiment.stats import sequential as seq
from servelab.experiment.stats.bootstrap import (
    MIN_REPS_TO_DECIDE,
    bootstrap_median_ci,
    bootstrap_ratio,
    verdict,
)
from servelab.experiment.stats.capacity import ArmCapacity, CapacityEffect, per_arm
from servelab.experiment.stats.capacity import compare as capacity_effect
from servelab.experiment.stats.runs import RunValue
from servelab.experiment.stats.throttle import Throttle, note, per_arm_throttle, saturation_note

CV_WARN = 0.10
ACCEPT_DIFF_WARN = 0.05


@dataclass(frozen=True, slots=True)
class Spread:
    """Median and spread of one arm x load point x metric over its runs."""

    arm: str
    load_key: str
    metric: str
    n: int
    median: float
    min: float
    max: float
    mean: float
    std: float  # sample standard deviation (ddof=1); NaN for n < 2
    cv: float  # std / mean
    ci_low: float  # bootstrap 95% CI of the median
    ci_high: float
    values: tuple[float, ...] = ()  # every run's value, in run order


@dataclass(frozen=True, slots=True)
class Effect:
    """arm / baseline for one load point and metric, with its CI and verdict."""

    arm: str
    baseline: str
    load_key: str
    metric: str
    ratio: float
    ci_low: float
    ci_high: float
    n: int  # pairs (paired) or min(n_arm, n_base)
    paired: bool
    # fixed repetitions: better | worse | within noise | too few runs | n/a (descriptive, or
    # runs that never measured it: energy without a GPU);
    # adaptive (rule 'sequential'): better | worse | no change | undecided | n/a
    verdict: str
    rule: str = "bootstrap"  # bootstrap: fixed-n 95% CI; sequential: always-valid (sequential.py)
    decided_at: int | None = None  # sequential: pairs at the look that decided

    def pct(self, x: float | None = None) -> float:
        return ((self.ratio if x is None else x) - 1.0) * 100.0

    def text(self) -> str:
        """`+47% [+41%, +52%]`."""
        if math.isnan(self.ratio):
            return "n/a"
        if math.isnan(self.ci_low):
            return f"{self.pct():+.1f}%"
        return f"{self.pct():+.1f}% [{self.pct(self.ci_low):+.1f}%, {self.pct(self.ci_high):+.1f}%]"


@dataclass
class Analysis:
    baseline: str
    arms: list[str]
    load_keys: list[str]
    noise_band: float
    spreads: dict[tuple[str, str, str], Spread] = field(default_factory=dict)
    effects: dict[tuple[str, str, str], Effect] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    design: seq.Design | None = None  # the stopping rule, for repetitions = "auto"
    # experiments with a capacity sweep ([load.sweep]): arm -> its SLO-capacity effect
    # (stats/capacity.py): the fixed-n CI, or under adaptive repetitions the always-valid
    # interval the stopping rule decides on at that load key; the report states these
    capacity: dict[str, CapacityEffect] = field(default_factory=dict)
    # each arm's capacity brackets, once a sweep has run (empty before: no capacity section)
    capacity_arms: list[ArmCapacity] = field(default_factory=list)
    # (arm, load key) -> which of its runs' GPUs slowed down (power cap, thermal) while measured
    throttle: dict[tuple[str, str], Throttle] = field(default_factory=dict)

    def throttle_note(self, arm: str, load_key: str) -> str | None:
        """`GPU throttled: sw_power_cap in 3/5 runs of b`: the throttling of the arm or the
        baseline at a load key, which could have moved its verdicts; None when none."""
        return note(self.throttle, arm, self.baseline, load_key)

    def saturation_note(self, arm: str, load_key: str) -> str | None:
        """`above saturation in 2/5 runs of b`: runs of the arm or the baseline at a load key
        whose queue grew throughout; None when none."""
        return saturation_note(self.throttle, arm, self.baseline, load_key)

    def verdict_note(self, arm: str, load_key: str) -> str | None:
        """What could have moved the verdicts of `arm` at a load key, shown beside them: GPU
        throttling and runs above saturation (`;`-joined); None when neither."""
        parts = [n for n in (self.throttle_note(arm, load_key),
                             self.saturation_note(arm, load_key)) if n]
        return "; ".join(parts) or None


def spread(arm: str, load_key: str, metric: str, values: Iterable[float]) -> Spread:
    v = np.asarray([x for x in values if math.isfinite(x)], float)
    if v.size == 0:
        nan = math.nan
        return Spread(arm, load_key, metric, 0, nan, nan, nan, nan, nan, nan, nan, nan)
    std = float(v.std(ddof=1)) if v.size > 1 else math.nan
    mean = float(v.mean())
    lo, hi = bootstrap_median_ci(v)
    return Spread(
        arm,
        load_key,
        metric,
        int(v.size),
        float(np.median(v)),
        float(v.min()),
        float(v.max()),
        mean,
        std,
        std / mean if mean else math.nan,
        lo,
        hi,
        tuple(float(x) for x in v),
    )


def analyze(
    runs: Sequence[RunValue],
    *,
    baseline: str,
    arms: Sequence[str],
    load_keys: Sequence[str],
    noise_band: float = 0.02,
    metrics: Sequence[str] = tuple(METRICS),
    design: seq.Design | None = None,
) -> Analysis:
    """Spreads, effects against the baseline and warnings for the ok runs of an experiment.
    With a sequential `design` (repetitions = "auto") every directional effect gets the
    always-valid interval of its block-paired ratios, in block order, and a decided verdict."""
    an = Analysis(
        baseline=baseline,
        arms=list(arms),
        load_keys=list(load_keys),
        noise_band=noise_band,
        design=design,
    )
    by: dict[tuple[str, str], list[RunValue]] = {}
    for r in runs:
        by.setdefault((r.arm, r.load_key), []).append(r)
    for arm in arms:
        for lk in load_keys:
            rs = by.get((arm, lk), [])
            for m in metrics:
                an.spreads[(arm, lk, m)] = spread(
                    arm, lk, m, (metric_value(r.summary, m) for r in rs)
                )
    for arm in arms:
        if arm == baseline:
            continue
        for lk in load_keys:
            a_runs, b_runs = by.get((arm, lk), []), by.get((baseline, lk), [])
            a_blk = {r.block: r for r in a_runs if r.block is not None}
            b_blk = {r.block: r for r in b_runs if r.block is not None}
            common = sorted(set(a_blk) & set(b_blk))
            paired = len(common) >= 2
            for m in metrics:
                if design is not None:
                    an.effects[(arm, lk, m)] = _sequential_effect(
                        arm,
                        baseline,
                        lk,
                        m,
                        [(a_blk[k], b_blk[k]) for k in common],
                        design,
                        noise_band,
                    )
                    continue
                if paired:
                    bv = [metric_value(b_blk[k].summary, m) for k in common]
                    av = [metric_value(a_blk[k].summary, m) for k in common]
                    n = len(common)
                else:
                    bv = [metric_value(r.summary, m) for r in b_runs]
                    av = [metric_value(r.summary, m) for r in a_runs]
                    n = min(len(av), len(bv))
                ratio, lo, hi = bootstrap_ratio(bv, av, paired=paired)
                v = verdict(ratio, lo, hi, noise_band, METRICS[m].higher_is_better)
                if av and bv and not (_measured(av) and _measured(bv)):
                    v = "n/a"  # runs, but a side never measured it (energy without a GPU)
                an.effects[(arm, lk, m)] = Effect(arm, baseline, lk, m, ratio, lo, hi, n, paired, v)
    if SWEEP_KEY in load_keys:
        _capacity(an, runs)
    an.throttle = per_arm_throttle(runs)
    an.warnings = _warnings(an, by)
    return an


def _capacity(an: Analysis, runs: Sequence[RunValue]) -> None:
    """The SLO-capacity effect of every arm (and each arm's brackets once a sweep ran): the
    fixed-n CI, or the always-valid interval under the experiment's stopping rule; at a
    secondary capacity load key its interval at alpha for itself, without a verdict."""
    design = an.design
    primary = design is None or design.is_primary(SWEEP_KEY)
    rule = design if design is None or primary else design.secondary()
    an.capacity = {
        arm: capacity_effect(runs, arm, an.baseline, an.noise_band, SWEEP_KEY, design=rule)
        for arm in an.arms
        if arm != an.baseline
    }
    if not primary:  # shown with its interval, no verdict
        an.capacity = {
            arm: replace(c, verdict=seq.SECONDARY, decided_at=None)
            for arm, c in an.capacity.items()
        }
    if any(r.load_key == SWEEP_KEY for r in runs):
        an.capacity_arms = per_arm(runs, an.arms, SWEEP_KEY)


def _sequential_effect(
    arm: str,
    baseline: str,
    lk: str,
    m: str,
    pairs: list[tuple[RunValue, RunValue]],
    design: seq.Design,
    band: float,
) -> Effect:
    """One effect under the adaptive rule: log ratios of the block pairs in block order. At a
    secondary load point it keeps its interval (at alpha for itself) but gets no verdict."""
    logr = []
    for a, b in pairs:
        av, bv = metric_value(a.summary, m), metric_value(b.summary, m)
        if math.isfinite(av) and math.isfinite(bv) and av > 0 and bv > 0:
            logr.append(math.log(av / bv))
    hib = METRICS[m].higher_is_better
    primary = design.is_primary(lk)
    bound = seq.confidence_sequence(logr, design if primary else design.secondary(), band, hib)
    verdict = "n/a" if hib is None else bound.verdict if primary else seq.SECONDARY
    if pairs and not (_measured([metric_value(a.summary, m) for a, _ in pairs])
                      and _measured([metric_value(b.summary, m) for _, b in pairs])):
        verdict = "n/a"  # never measured on one side (energy without a GPU): nothing to decide
    return Effect(
        arm,
        baseline,
        lk,
        m,
        bound.ratio,
        bound.ci_low,
        bound.ci_high,
        bound.n,
        True,
        verdict,
        "sequential",
        bound.decided_at if primary else None,
    )


def _measured(values: Iterable[float]) -> bool:
    """Whether any run measured the metric (a finite value)."""
    return any(math.isfinite(x) for x in values)


def undecided(an: Analysis, metric: str) -> list[tuple[str, str]]:
    """(arm, load key) of the primary effects an adaptive experiment has not decided yet. At a
    capacity sweep's load key the primary effect is the SLO capacity itself (not the primary
    metric at the point where capacity was found). Secondary load points are never waited for."""
    out = []
    for arm in an.arms:
        if arm == an.baseline:
            continue
        for lk in an.load_keys:
            if an.design is not None and not an.design.is_primary(lk):
                continue
            e = an.capacity.get(arm) if lk == SWEEP_KEY else an.effects.get((arm, lk, metric))
            if e is None or e.verdict == seq.UNDECIDED:
                out.append((arm, lk))
    return out


def _warnings(an: Analysis, by: dict[tuple[str, str], list[RunValue]]) -> list[str]:
    out: list[str] = []
    ns = [len(v) for v in by.values()]
    if not ns:
        return ["no successful runs: nothing to compare"]
    if an.design is None and min(ns) < MIN_REPS_TO_DECIDE:
        out.append(
            f"only {min(ns)} repetition(s) for some arm and load point: a bootstrap over so "
            f"few runs has few distinct resamples, and a rank test with 3 vs 3 can never "
            f"reach p < 0.05; use >= {MIN_REPS_TO_DECIDE} repetitions before deciding"
        )
    for arm in an.arms:
        for lk in an.load_keys:
            if not by.get((arm, lk)):
                out.append(f"arm {arm} at {lk}: no successful run")
    for (arm, lk), rs in by.items():
        bad = sum(int(r.summary.get("failed") or 0) for r in rs)
        if bad:
            total = bad + sum(int(r.summary.get("completed") or 0) for r in rs)
            out.append(
                f"arm {arm} at {lk}: {bad} of {total} requests failed in its ok runs; "
                "see the runs' failure_reasons (servelab results show ID)"
            )
    noisy: dict[tuple[str, str], list[str]] = {}
    for (arm, lk, m), s in an.spreads.items():
        if METRICS[m].higher_is_better is not None and s.n >= 2 and s.cv > CV_WARN:
            noisy.setdefault((arm, lk), []).append(f"{METRICS[m].label} {s.cv * 100:.0f}%")
    for (arm, lk), items in noisy.items():
        out.append(
            f"arm {arm} at {lk}: CV between runs > {CV_WARN * 100:.0f}% ({', '.join(items)}): "
            "the machine is noisy or the runs too short"
        )
    for lk in an.load_keys:
        # only arms that speculate (tau > 1): an arm without drafts differs by design
        acc = {
            arm: an.spreads[(arm, lk, "accept_length")].median
            for arm in an.arms
            if (arm, lk, "accept_length") in an.spreads
            and an.spreads[(arm, lk, "accept_length")].median > 1.05
        }
        if len(acc) >= 2:
            lo_arm, hi_arm = min(acc, key=acc.get), max(acc, key=acc.get)  # type: ignore[arg-type]
            if acc[hi_arm] > acc[lo_arm] * (1 + ACCEPT_DIFF_WARN):
                out.append(
                    f"at {lk}: acceptance length differs between arms ({hi_arm} "
                    f"{acc[hi_arm]:.2f} vs {lo_arm} {acc[lo_arm]:.2f}) on the same workload: "
                    f"part of the effect may be the drafts, not the lever"
                )
    return out


def headline(an: Analysis, metric: str) -> list[str]:
    """One line per non-baseline arm: `mtp: +47% [+41%, +52%] at c=1, within noise at c=16`."""
    lines = []
    for arm in an.arms:
        if arm == an.baseline:
            continue
        parts = []
        for lk in an.load_keys:
            e = an.effects.get((arm, lk, metric))
            if e is None:
                continue
            thr = an.verdict_note(arm, lk)
            why = f"; {thr}" if thr else ""
            if e.verdict in ("better", "worse"):
                parts.append(f"{e.text()} at {lk} ({e.verdict}{why})")
            elif e.verdict == seq.SECONDARY:
                parts.append(f"{e.text()} at {lk} (secondary: no verdict{why})")
            else:
                parts.append(f"{e.verdict} at {lk} ({e.text()}{why})")
        lines.append(f"{arm} vs {an.baseline}, {METRICS[metric].label}: " + ", ".join(parts))
    return lines
