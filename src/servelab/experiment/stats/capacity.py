"""SLO capacity as an experiment metric: a run of load key `capacity` (`[load.sweep]`) is one
capacity search (bench/sweep.py) against the arm's deployment, and arms compare on the capacity
it brackets (docs/METRICS.md, "Capacity under SLOs", and docs/EXPERIMENTS.md).

A run's stored load point is the sweep's point AT the capacity (the largest rate that met every
SLO; the synchronous point when none did), its summary carrying the bracket under `capacity`;
every other point of the sweep is stored as an ordinary load point beside it (ids under
`sweep_point_ids`). So the attribution table's row `capacity` compares the arms where each
sustains its SLOs, and the points of every sweep feed the latency-throughput curves.

This module is the statistical half; run/sweeps.py measures the sweeps.

A capacity is an interval, never a number it is not: `[low, high)` req/s, `high` open (inf)
above saturation, `low` 0 when no rate met the SLOs. The effect of an arm is compared per
block by interval arithmetic: the ratio lies in [a_low / b_high, a_high / b_low]; the geometric
mean of each end over the blocks is bootstrapped (blocks resampled, as stats/bootstrap.py does) and the
95% CI runs from the lower end's low quantile to the upper end's high quantile, so the bracket
width and the noise between blocks both widen it. An open bound makes that end of the CI open
(+inf, or -100%), and the point estimate (the geometric mean of the bracket midpoints) is given
only when every bracket is closed.

With adaptive repetitions (`repetitions = "auto"`) the same ends get the experiment's always-valid
interval instead (sequential.py: the repeated-t boundary at the design's nominal level, looks in
block order, running intersection, a decision never reverses): the lower end from the lower
ends' sequence, the upper end from the upper ends'. The runner's stopping rule reads that
verdict for the `capacity` load key (stats/analysis.py undecided), so an adaptive experiment with a sweep
runs until its capacity effect is decided, and the report states the same interval.

Why the interval of a few noisy sweeps is wide (measured, docs/performance.md): each end of the
fixed-n CI is a bootstrap quantile of a geometric mean over blocks; at n = 5 the expanded
percentile bootstrap takes its 0.1% quantile, i.e. a resample that repeats the most extreme
block four times. One disturbed sweep (a capacity 10x below its siblings) therefore sets that
end almost alone: the interval reports the spread of the sweeps, and only steadier sweeps
(SLOs that bind where the latency curve is steep, enough requests per point, a quiet machine)
or more blocks narrow it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from servelab.bench.sweep import bracket_text
from servelab.experiment.stats import sequential as seq
from servelab.experiment.stats.bootstrap import MIN_REPS_TO_DECIDE, expanded_alpha, rule, t_interval
from servelab.experiment.stats.runs import RunValue


@dataclass(frozen=True, slots=True)
class Bracket:
    """One run's capacity in req/s: `low` met every SLO, `high` missed one (inf: open)."""

    status: str
    low: float
    high: float

    @property
    def closed(self) -> bool:
        return self.low > 0 and math.isfinite(self.high)

    def text(self) -> str:
        """`1.2-1.5`, `>= 1.2`, `< 0.8`, `0` (bench/sweep.py bracket_text, 3 digits)."""
        return bracket_text(self.status, self.low, self.high, digits=3, sep="-")


def bracket_of(summary: Mapping[str, Any]) -> Bracket | None:
    """The capacity bracket stored with a run's summary (None for a run that is no sweep)."""
    c = summary.get("capacity")
    if not isinstance(c, Mapping) or "status" not in c:
        return None
    lo, hi = c.get("low_req_s"), c.get("high_req_s")
    if c["status"] == "unmet_at_synchronous":  # below the lightest load: under the sync rate
        hi = c.get("synchronous_req_s")
    return Bracket(c["status"], float(lo) if lo else 0.0, float(hi) if hi else math.inf)


@dataclass(frozen=True, slots=True)
class CapacityEffect:
    """arm / baseline SLO capacity: point estimate (NaN unless every bracket is closed), 95% CI
    whose ends may be open (0 or inf), verdict against the noise band."""

    arm: str
    baseline: str
    slo_text: str
    n: int  # blocks with a sweep of both arms
    ratio: float
    ci_low: float
    ci_high: float
    # fixed repetitions: better | worse | within noise | inconclusive | too few runs;
    # adaptive (rule 'sequential'): better | worse | no change | undecided
    verdict: str
    open_blocks: int  # blocks where a bracket was open (above saturation, unmet)
    rule: str = "bootstrap"  # bootstrap: fixed-n 95% CI; sequential: always-valid (sequential.py)
    decided_at: int | None = None  # sequential: blocks at the look that decided

    def pct_text(self) -> str:
        """`+18% [+9%, +27%]`; open ends as `-100%` / `+inf`."""
        def pc(x: float) -> str:
            if math.isinf(x):
                return "+inf"
            return f"{(x - 1) * 100:+.0f}%"
        if self.n == 0:
            return "n/a"
        mid = pc(self.ratio) + " " if math.isfinite(self.ratio) else ""
        if math.isnan(self.ci_low):
            return mid.strip() or "n/a"
        return f"{mid}[{pc(self.ci_low)}, {pc(self.ci_high)}]"

    def sentence(self) -> str:
        """The verdict as a reader wants it: `mtp raises SLO capacity under ... by +18% [...]`."""
        under = f"SLO capacity under {self.slo_text}"
        if self.verdict in ("better", "worse") and math.isnan(self.ratio):  # open brackets
            verb, bound = (("raises", self.ci_low - 1) if self.verdict == "better"
                           else ("lowers", 1 - self.ci_high))
            return (f"{self.arm} {verb} {under} by at least {bound * 100:.0f}% (95% CI "
                    f"{self.pct_text()}; {self.open_blocks} of {self.n} blocks with an open "
                    f"bracket, so no point estimate) (vs {self.baseline})")
        if self.verdict == "better":
            return f"{self.arm} raises {under} by {self.pct_text()} (vs {self.baseline})"
        if self.verdict == "worse":
            return f"{self.arm} lowers {under} by {self.pct_text()} (vs {self.baseline})"
        if self.verdict in ("within noise", seq.NO_CHANGE):
            return (f"{self.arm} leaves {under} unchanged within the noise band: "
                    f"{self.pct_text()} (vs {self.baseline})")
        if self.verdict == seq.UNDECIDED:
            return (f"{self.arm}'s effect on {under} is not decided yet after {self.n} blocks: "
                    f"{self.pct_text()} (vs {self.baseline})")
        if self.verdict == "too few runs":
            return f"{self.arm} vs {self.baseline}, {under}: too few paired sweeps to decide"
        return (f"{self.arm}'s effect on {under} is inconclusive: {self.pct_text()} "
                f"(vs {self.baseline})")


def _geo(logs: np.ndarray) -> np.ndarray:
    """Geometric means along the last axis of arrays of logs that may hold -inf or +inf."""
    with np.errstate(invalid="ignore"):
        return np.exp(logs.mean(axis=-1))


def compare(runs: Sequence[RunValue], arm: str, baseline: str, band: float, load_key: str,
            n_boot: int = 10_000, seed: int = 0, design: seq.Design | None = None
            ) -> CapacityEffect:
    """The capacity effect of `arm` over `baseline` from their sweeps paired by block; with an
    adaptive `design`, the always-valid interval and its decision (module docstring)."""
    a = {r.block: bracket_of(r.summary) for r in runs if r.arm == arm and r.load_key == load_key}
    b = {r.block: bracket_of(r.summary) for r in runs
         if r.arm == baseline and r.load_key == load_key}
    blocks = sorted(k for k in set(a) & set(b) if k is not None and a[k] and b[k])
    slo_text = next((str(r.summary["capacity"].get("slo_text") or "") for r in runs
                     if r.load_key == load_key and isinstance(r.summary.get("capacity"), Mapping)),
                    "")
    n = len(blocks)
    nan = math.nan
    if n == 0:
        if design is not None:
            return CapacityEffect(arm, baseline, slo_text, 0, nan, nan, nan, seq.UNDECIDED, 0,
                                  "sequential")
        return CapacityEffect(arm, baseline, slo_text, 0, nan, nan, nan, "too few runs", 0)
    pa = [a[k] for k in blocks]
    pb = [b[k] for k in blocks]
    with np.errstate(divide="ignore"):
        lo = np.log(np.array([x.low for x in pa])) - np.log(np.array([y.high for y in pb]))
        hi = np.log(np.array([x.high for x in pa])) - np.log(np.array([y.low for y in pb]))
    open_blocks = sum(not (x.closed and y.closed) for x, y in zip(pa, pb, strict=True))
    ratio = float(_geo((lo + hi) / 2)) if open_blocks == 0 else nan
    if design is not None:
        ci_lo, ci_hi, v, at = _sequential(lo, hi, design, band)
        return CapacityEffect(arm, baseline, slo_text, n, ratio, ci_lo, ci_hi, v, open_blocks,
                              "sequential", at)
    if n < 2:
        return CapacityEffect(arm, baseline, slo_text, n, ratio, nan, nan, "too few runs",
                              open_blocks)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    alpha = expanded_alpha(n) / 2
    # order statistics, not interpolation (inf - inf is NaN), each rounded outwards
    ci_lo = float(np.quantile(_geo(lo[idx]), alpha, method="lower"))
    ci_hi = float(np.quantile(_geo(hi[idx]), 1 - alpha, method="higher"))
    if n < MIN_REPS_TO_DECIDE:  # as bootstrap_ratio: at least the Student-t interval
        if np.isfinite(lo).all():
            ci_lo = min(ci_lo, t_interval(lo)[0])
        if np.isfinite(hi).all():
            ci_hi = max(ci_hi, t_interval(hi)[1])
    v = rule(ci_lo, ci_hi, band, True, inside="within noise", across="inconclusive",
             missing="inconclusive")
    return CapacityEffect(arm, baseline, slo_text, n, ratio, ci_lo, ci_hi, v, open_blocks)


def _sequential(lo: np.ndarray, hi: np.ndarray, design: seq.Design, band: float
                ) -> tuple[float, float, str, int | None]:
    """(CI low, CI high, verdict, blocks at the deciding look) of the always-valid interval:
    at every look n = min_n .. min(blocks, max_n), the lower ends' repeated-t lower bound and
    the upper ends' upper bound at the design's nominal level, intersected with the earlier
    looks'. An open bracket in the first n blocks leaves that end of look n open (-100% / +inf).
    Each side of the two-sided boundary errs with about half the design's alpha, so the
    pair covers the capacity ratio at every look at once with about 1 - alpha."""
    n_all = min(int(lo.size), design.max_n)
    if n_all < design.min_n:
        return math.nan, math.nan, seq.UNDECIDED, None
    low, high = -math.inf, math.inf
    decided: int | None = None
    verdict = seq.UNDECIDED
    for n in range(design.min_n, n_all + 1):
        b = design.t_bound(n) / math.sqrt(n)
        x, y = lo[:n], hi[:n]
        lo_n = float(x.mean() - b * x.std(ddof=1)) if np.isfinite(x).all() else -math.inf
        hi_n = float(y.mean() + b * y.std(ddof=1)) if np.isfinite(y).all() else math.inf
        low, high = max(low, lo_n), min(high, hi_n)
        if low > high:  # the looks disagree (far from Gaussian): keep the latest, as sequential.py
            low, high = lo_n, hi_n
        if decided is None:
            v = seq.decide(math.exp(low), math.exp(high), band, True)
            if v != seq.UNDECIDED:
                decided, verdict = n, v
    return math.exp(low), math.exp(high), verdict, decided


@dataclass(frozen=True, slots=True)
class ArmCapacity:
    """One arm's capacity over its sweeps: the median of each end and every run's bracket."""

    arm: str
    brackets: tuple[Bracket, ...]
    paired: int = 0  # sweeps measured point by point alternately with another arm's

    def text(self) -> str:
        if not self.brackets:
            return "n/a"
        lo = float(np.median([x.low for x in self.brackets]))
        his = [x.high for x in self.brackets]
        hi = float(np.median(his)) if all(math.isfinite(h) for h in his) else math.inf
        n_open = sum(not x.closed for x in self.brackets)
        head = Bracket("bracketed" if math.isfinite(hi) else "above_saturation", lo, hi).text()
        tail = f", open in {n_open}" if n_open else ""
        tail += f", {self.paired} paired point by point" if self.paired else ""
        return f"{head} req/s (median bracket over {len(self.brackets)} sweeps{tail})"


def per_arm(runs: Sequence[RunValue], arms: Sequence[str], load_key: str) -> list[ArmCapacity]:
    out = []
    for arm in arms:
        mine = [r.summary for r in runs if r.arm == arm and r.load_key == load_key]
        bs = [bracket_of(s) for s in mine]
        paired = sum(bool((s.get("capacity") or {}).get("paired_with")) for s in mine)
        out.append(ArmCapacity(arm, tuple(b for b in bs if b is not None), paired))
    return out


def to_json(effect: CapacityEffect) -> dict[str, Any]:
    """JSON form (inf as None with the end named open)."""
    d = asdict(effect)
    for k in ("ratio", "ci_low", "ci_high"):
        x = d[k]
        d[k] = x if isinstance(x, float) and math.isfinite(x) else None
    d["sentence"] = effect.sentence()
    return d
