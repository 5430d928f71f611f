"""GPU throttling beside a verdict: which runs of an arm x load point had their GPUs slowed
during the load (power cap, thermal or hardware slowdown), from the `throttle_reasons` each
load point's telemetry stored ({GPU index: {reason: share of samples}}, telemetry/point.py);
and which were above saturation (their queue grew throughout: `above_saturation`, from the
load point's steadiness test), so their latencies are a transient, not the rate's.

A verdict at a load key could have been moved by a throttled GPU in either the arm or the
baseline, so the note of an effect names both (`note`): `GPU throttled: sw_power_cap in 3/5 runs
of b`. Idle and clock-setting reasons are no slowdown and never counted; a run without GPU
telemetry (None: NVML n/a) counts as not measured, not as unthrottled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from servelab.experiment.stats.runs import RunValue
from servelab.telemetry.gpu import SLOWDOWNS


@dataclass(frozen=True, slots=True)
class Throttle:
    """The throttling of one arm x load point over its ok runs."""

    arm: str
    load_key: str
    runs: int  # ok runs that count
    measured: int  # of which had GPU telemetry
    reasons: dict[str, int] = field(default_factory=dict)  # slowdown reason -> runs it was seen in
    saturated: int = 0  # runs whose load point was above saturation

    def text(self) -> str:
        """`sw_power_cap in 3/5 runs of b` (one per reason), '' when none: out of the runs with
        GPU telemetry (a run without it is not measured, not unthrottled), the others named."""
        unmeasured = self.runs - self.measured
        tail = f" ({unmeasured} more without GPU telemetry)" if unmeasured else ""
        return ", ".join(f"{r} in {n}/{self.measured} runs of {self.arm}{tail}"
                         for r, n in sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0])))

    def to_json(self) -> dict[str, Any]:
        return {"arm": self.arm, "load_key": self.load_key, "runs": self.runs,
                "measured": self.measured, "reasons": dict(self.reasons),
                "above_saturation": self.saturated}


def slowdowns(summary: Mapping[str, Any]) -> set[str] | None:
    """The slowdown reasons any GPU of a load point showed (share > 0); None without GPU
    telemetry."""
    tr = summary.get("throttle_reasons")
    if not isinstance(tr, Mapping):
        return None
    return {r for per in tr.values() if isinstance(per, Mapping)
            for r, share in per.items()
            if r in SLOWDOWNS and isinstance(share, int | float) and share > 0}


def per_arm_throttle(runs: Iterable[RunValue]) -> dict[tuple[str, str], Throttle]:
    """(arm, load key) -> its throttling over `runs` (the ok runs that count)."""
    acc: dict[tuple[str, str], tuple[int, int, dict[str, int], int]] = {}
    for r in runs:
        n, m, seen, sat = acc.get((r.arm, r.load_key), (0, 0, {}, 0))
        got = slowdowns(r.summary)
        for reason in got or ():
            seen[reason] = seen.get(reason, 0) + 1
        acc[(r.arm, r.load_key)] = (n + 1, m + (got is not None), seen,
                                    sat + (r.summary.get("above_saturation") is True))
    return {k: Throttle(k[0], k[1], n, m, seen, sat) for k, (n, m, seen, sat) in acc.items()}


def note(throttle: Mapping[tuple[str, str], Throttle], arm: str, baseline: str,
         load_key: str) -> str | None:
    """`GPU throttled: sw_power_cap in 3/5 runs of b` for the effect of `arm` against `baseline`
    at `load_key`; None when neither side's GPUs slowed down."""
    parts = [t.text() for a in dict.fromkeys((arm, baseline))
             if (t := throttle.get((a, load_key))) is not None and t.reasons]
    return f"GPU throttled: {'; '.join(parts)}" if parts else None


def saturation_note(throttle: Mapping[tuple[str, str], Throttle], arm: str, baseline: str,
                    load_key: str) -> str | None:
    """`above saturation in 2/5 runs of b` for the effect of `arm` against `baseline` at
    `load_key`: runs whose queue grew throughout the load, so their latencies were still
    climbing when it ended; None when no run of either side was."""
    parts = [f"{t.saturated}/{t.runs} runs of {a}" for a in dict.fromkeys((arm, baseline))
             if (t := throttle.get((a, load_key))) is not None and t.saturated]
    return f"above saturation in {', '.join(parts)}" if parts else None


def with_note(verdict: str, text: str | None) -> str:
    """`better  (GPU throttled: ...)`: the verdict with its throttling note, if any."""
    return f"{verdict}  ({text})" if text else verdict
