"""TTFT by turn index per arm and load point, for multi-turn workloads: each run's summary
stores its per-turn TTFT median and p90 (`by_turn`, defined in servelab.bench.metrics); here
they are only combined over runs (the median over the runs that count, as the spread table
does for every other metric), never recomputed from the requests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servelab.experiment.stats.evidence import Evidence


@dataclass(frozen=True, slots=True)
class TurnTTFT:
    """One arm x load point x turn: over `runs` runs, the median of the runs' TTFT median and
    of their p90 (ms), and of their median input tokens (the history grows with the turn)."""

    arm: str
    load_key: str
    turn: int
    runs: int
    ttft_median_ms: float | None
    ttft_p90_ms: float | None
    input_tokens: float | None


def _med(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def ttft_by_turn(ev: Evidence) -> list[TurnTTFT]:
    """Every arm x load point x turn that some counted run measured (arms and load points in
    the analysis' order); empty when no run stored turns."""
    per: dict[tuple[str, str, int], list[dict]] = {}
    for r in ev.runs:
        lp = ev.load_points.get(r.load_point_id) if r.load_point_id else None
        if r.status != "ok" or lp is None or r.block in ev.excluded:
            continue
        for row in lp.summary.get("by_turn") or []:
            per.setdefault((r.arm, r.load_key, int(row["turn"])), []).append(row)
    out = []
    an = ev.analysis
    for arm in an.arms:
        for lk in an.load_keys:
            for turn in sorted(t for a, k, t in per if a == arm and k == lk):
                rows = per[(arm, lk, turn)]
                tt = [row.get("ttft_ms") or {} for row in rows]
                out.append(TurnTTFT(
                    arm, lk, turn, len(rows),
                    _med([x["median"] for x in tt if x.get("median") is not None]),
                    _med([x["p90"] for x in tt if x.get("p90") is not None]),
                    _med([row["input_tokens_median"] for row in rows
                          if row.get("input_tokens_median") is not None])))
    return out
