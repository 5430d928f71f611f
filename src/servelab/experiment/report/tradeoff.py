"""The latency-throughput trade-off of an experiment, as data for the report's interactive
charts (report/sections.py): per arm, one point per load point measured (the runs' own
and every point of their capacity sweeps), with TTFT, TPOT and E2E at p50/p95/p99 against the
achieved request throughput; the SLO limits to draw; and tok/s per user against tok/s per GPU
with each arm's Pareto front (vLLM's `bench sweep` plot).

- **tok/s per user** = 1000 / median TPOT: the decode speed one stream sees.
- **tok/s per GPU** = output tok/s / GPUs of the deployment (from the run's provenance); a
  deployment without GPUs (the embedded engine on a CPU) counts as one, and the axis says so.

Repetitions of the same arm x load point are pooled as medians: the charts show where each arm
sits; the uncertainty lives in the statistics tables. Each arm's median capacity bracket
(offered req/s) is shaded on the latency charts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servelab.bench.slo import parse_slo
from servelab.experiment.design.model import ExperimentSpec
from servelab.experiment.stats.capacity import bracket_of
from servelab.store import LoadPointRow, Store

LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E"))
STATS = (("median", "p50"), ("p95", "p95"), ("p99", "p99"))


@dataclass(frozen=True, slots=True)
class Point:
    """One arm x load point, medians over its load points (`n` of them)."""

    arm: str
    load_key: str
    n: int
    req_s: float | None
    tok_s: float | None
    tok_s_user: float | None
    tok_s_gpu: float | None
    latency: dict[str, float | None]  # "ttft_ms.p95" -> ms
    slo_met: bool | None  # from the sweep's verdict (None outside sweeps)


@dataclass
class Tradeoff:
    arms: list[str]
    points: list[Point] = field(default_factory=list)
    slo_lines: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # metric -> (label, ms)
    per_gpu_label: str = "output tok/s per GPU"
    window: dict[str, int] = field(default_factory=dict)  # arm -> runs pooled (curve smoothing)
    capacity: dict[str, tuple[float, float | None]] = field(default_factory=dict)  # median bracket

    def front(self, arm: str) -> list[Point]:
        """The arm's Pareto front: points no other point beats on both tok/s per GPU and per user,
        ordered by tok/s per GPU."""
        pts = [p for p in self.points if p.arm == arm and p.tok_s_gpu and p.tok_s_user]
        out = [p for p in pts if not any(
            q.tok_s_gpu >= p.tok_s_gpu and q.tok_s_user >= p.tok_s_user  # type: ignore[operator]
            and (q.tok_s_gpu > p.tok_s_gpu or q.tok_s_user > p.tok_s_user)  # type: ignore[operator]
            for q in pts)]
        return sorted(out, key=lambda p: p.tok_s_gpu)  # type: ignore[arg-type,return-value]

    def to_json(self) -> dict[str, Any]:
        """The payload the charts' script reads."""
        return {
            "arms": self.arms,
            "latencies": [{"key": k, "label": lab} for k, lab in LATENCIES],
            "stats": [{"key": k, "label": lab} for k, lab in STATS],
            "slo": {k: [{"label": lab, "ms": v} for lab, v in vs] for k, vs in self.slo_lines.items()},
            "per_gpu_label": self.per_gpu_label,
            "points": [
                {"arm": p.arm, "load": p.load_key, "n": p.n, "req_s": p.req_s, "tok_s": p.tok_s,
                 "tok_s_user": p.tok_s_user, "tok_s_gpu": p.tok_s_gpu, "slo_met": p.slo_met,
                 **{k: v for k, v in p.latency.items()}}
                for p in self.points
            ],
            "front": {a: [[p.tok_s_gpu, p.tok_s_user] for p in self.front(a)] for a in self.arms},
            "window": self.window,
            "capacity": {a: [lo, hi] for a, (lo, hi) in self.capacity.items()},
        }


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def _med(xs: Iterable[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return float(np.median(v)) if v else None


def slo_lines(text: str | None, workload_goodput: Mapping[str, float] | None = None
              ) -> dict[str, list[tuple[str, float]]]:
    """metric -> [(label, limit ms)] of the experiment's sweep SLOs (`[load.sweep] slo`, the
    text) and its goodput SLOs."""
    out: dict[str, list[tuple[str, float]]] = {}
    sset = parse_slo(text) if text else None
    for s in sset.slos if sset else ():
        label = f"SLO {s.key} <= {s.limit_ms:g}" + ("" if s.stat else " per request")
        out.setdefault(s.metric, []).append((label, s.limit_ms))
    for k, v in (workload_goodput or {}).items():
        if k in ("ttft_ms", "tpot_ms", "e2e_ms") and all(v != ms for _, ms in out.get(k, [])):
            out.setdefault(k, []).append((f"goodput {k} <= {v:g}", float(v)))
    return out


def collect(store: Store, spec: ExperimentSpec, runs: Iterable[Any],
            load_points: Mapping[int, LoadPointRow], arms: list[str]) -> Tradeoff:
    """Every load point of the experiment's ok runs (sweep points included), pooled per arm x
    load point."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    gpus_seen: set[int] = set()
    sweeps: dict[str, int] = {}
    brackets: dict[str, list[tuple[float, float]]] = {}
    for r in runs:
        lp = load_points.get(r.load_point_id) if r.load_point_id else None
        if r.status != "ok" or lp is None:
            continue
        if lp.summary.get("sweep_point_ids"):
            sweeps[r.arm] = sweeps.get(r.arm, 0) + 1
        b = bracket_of(lp.summary)
        if b is not None:
            brackets.setdefault(r.arm, []).append((b.low, b.high))
        n_gpu = len(lp.provenance.get("gpus") or [])
        gpus_seen.add(n_gpu)
        rows = [lp] + [store.load_point(i) for i in lp.summary.get("sweep_point_ids") or []]
        for row in rows:
            s = dict(row.summary)
            s["_gpus"] = max(1, n_gpu)
            groups.setdefault((r.arm, row.load_key), []).append(s)
    sweep = spec.load.sweep
    tr = Tradeoff(arms=list(arms), slo_lines=slo_lines(sweep.slo if sweep else None,
                                                      spec.workload.goodput))
    tr.window = {a: n if n % 2 else n + 1 for a, n in sweeps.items() if n > 1}
    for a, bs in brackets.items():  # the median bracket; an open end stays open (None)
        hi = float(np.median([h for _, h in bs]))
        tr.capacity[a] = (float(np.median([lo for lo, _ in bs])), hi if math.isfinite(hi) else None)
    if gpus_seen == {0}:
        tr.per_gpu_label = "output tok/s per deployment (no GPU: counted as one)"
    for (arm, lk), ss in groups.items():
        lat: dict[str, float | None] = {}
        for key, _ in LATENCIES:
            for st, _ in STATS:
                lat[f"{key}.{st}"] = _med(_num((s.get(key) or {}).get(st)) for s in ss)
        tpot = lat["tpot_ms.median"]
        tok = _med(_num(s.get("output_throughput_tok_s")) for s in ss)
        per_gpu = _med(_num(s.get("output_throughput_tok_s")) and
                       _num(s.get("output_throughput_tok_s")) / s["_gpus"] for s in ss)  # type: ignore[operator]
        met = [(s.get("sweep") or {}).get("slo_met") for s in ss]
        met_known = [m for m in met if m is not None]
        tr.points.append(Point(
            arm=arm, load_key=lk, n=len(ss),
            req_s=_med(_num(s.get("request_throughput_req_s")) for s in ss),
            tok_s=tok, tok_s_user=1000.0 / tpot if tpot else None, tok_s_gpu=per_gpu,
            latency=lat, slo_met=(sum(met_known) * 2 > len(met_known)) if met_known else None,
        ))
    tr.points.sort(key=lambda p: (arms.index(p.arm) if p.arm in arms else 99, p.req_s or 0.0))
    return tr
