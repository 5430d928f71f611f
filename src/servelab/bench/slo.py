"""Service-level objectives (SLOs) and whether a load point meets them (docs/METRICS.md,
"Capacity under SLOs").

Two kinds, both upper bounds in milliseconds on the latencies `bench/metrics.py` defines:

- **Percentile SLOs** `ttft_p99_ms=2000`, `tpot_p95_ms=50`, `e2e_median_ms=...`, `itl_p99_ms`:
  the load point's statistic must not exceed the limit. The statistic is taken over completed
  requests, so failed requests count as misses through their share: more failures than the
  tail the percentile leaves (1% for p99, 5% for p95, 10% for p90, 50% for the median; none for
  the mean) misses the SLO, however fast the survivors were (an overloaded server that times
  requests out must not look fast).
- **Per-request SLOs** `ttft_ms=500`, `tpot_ms=50`, `e2e_ms=...` (the `--goodput` keys; vLLM's
  `ttft:500 tpot:50 e2el:...` spelling too): a request meets them when it completed and meets
  every one (the goodput definition); the load point meets them when at least `attainment`
  (default 0.99, `attainment=0.9` in the same string) of the requests it issued did.

Only the summary is read (never the per-request records), so the SLOs of stored load points can
be re-evaluated later with other limits.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servelab.bench.config import GOODPUT_KEYS, split_pairs
from servelab.errors import UserError

# metric names in SLO keys -> the summary's latency objects
_METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2e": "e2e_ms",
            "e2el": "e2e_ms"}
# statistic names in SLO keys -> the latency object's keys (bench/metrics.py STAT_KEYS)
_STATS = {"mean": "mean", "median": "median", "p50": "median", "p90": "p90", "p95": "p95",
          "p99": "p99"}
# the share of requests a statistic may lose to failures before it stops describing the load
_FAILED_SHARE = {"mean": 0.0, "median": 0.5, "p90": 0.10, "p95": 0.05, "p99": 0.01}
# requests per load point below which a tail statistic is its slowest value or two
_MIN_N = {"p90": 10, "p95": 20, "p99": 100}
_KEY_RE = re.compile(r"(ttft|tpot|itl|e2el|e2e)(?:_(mean|median|p50|p90|p95|p99))?(?:_ms)?")
_EXAMPLE = "ttft_p99_ms=2000,tpot_p99_ms=50 (or per request: 'ttft:500 tpot:50')"


@dataclass(frozen=True, slots=True)
class Slo:
    """One objective: `stat` of `metric` at most `limit_ms`; `stat` None is per request."""

    metric: str  # a summary latency key: ttft_ms, tpot_ms, itl_ms, e2e_ms
    stat: str | None  # mean, median, p90, p95, p99; None: every request (goodput)
    limit_ms: float

    def __post_init__(self) -> None:
        if self.metric not in _METRICS.values():
            raise UserError(f"--slo: unknown metric {self.metric!r}; use ttft, tpot, itl or e2e")
        if self.stat is None and self.metric not in GOODPUT_KEYS:
            raise UserError(f"--slo {self.metric}: a per-request SLO is one of "
                            f"{', '.join(GOODPUT_KEYS)}; for ITL give a percentile, e.g. itl_p99_ms")
        if self.stat is not None and self.stat not in _FAILED_SHARE:
            raise UserError(f"--slo: unknown statistic {self.stat!r}; use one of "
                            f"{', '.join(_FAILED_SHARE)}")
        if not (self.limit_ms > 0 and math.isfinite(self.limit_ms)):
            raise UserError(f"--slo {self.key}={self.limit_ms}: the limit must be a number of "
                            "milliseconds > 0")

    @property
    def key(self) -> str:
        """`ttft_p99_ms`, or `ttft_ms` for a per-request SLO."""
        stem = self.metric[: -len("_ms")]
        return f"{stem}_{self.stat}_ms" if self.stat else self.metric


@dataclass(frozen=True, slots=True)
class SloCheck:
    """How one load point fared: `met`, the worst `ratio` of measured to allowed (above 1 misses;
    None when a value is missing), the value behind each SLO key (ms; for the per-request SLOs
    together, key `attainment`, the share of issued requests that met them) and why it missed."""

    met: bool
    ratio: float | None
    values: dict[str, float | None]
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SloSet:
    """The SLOs a capacity is measured against; `attainment` applies to the per-request ones."""

    slos: tuple[Slo, ...]
    attainment: float = 0.99

    def __post_init__(self) -> None:
        if not self.slos:
            raise UserError(f"--slo needs at least one objective, e.g. {_EXAMPLE}")
        keys = [s.key for s in self.slos]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        if dup:
            raise UserError(f"--slo gives {', '.join(dup)} more than once")
        if not 0.0 < self.attainment <= 1.0:
            raise UserError(f"--slo attainment={self.attainment}: give a share in (0, 1], "
                            "e.g. attainment=0.99")

    @property
    def per_request(self) -> dict[str, float]:
        """The per-request SLOs as a `--goodput` dict ({"ttft_ms": 500.0, ...})."""
        return {s.metric: s.limit_ms for s in self.slos if s.stat is None}

    def goodput(self) -> dict[str, float]:
        """The SLOs that `goodput_req_s` should count against: the per-request ones when there
        are any, else each metric's tightest percentile limit (so the load point's goodput is
        read against the same numbers)."""
        if self.per_request:
            return self.per_request
        out: dict[str, float] = {}
        for s in self.slos:
            if s.metric in GOODPUT_KEYS:
                out[s.metric] = min(out.get(s.metric, math.inf), s.limit_ms)
        return out

    def describe(self) -> str:
        """`ttft_p99_ms <= 2000, tpot_ms <= 50 for 99% of requests`."""
        parts = [f"{s.key} <= {s.limit_ms:g}" for s in self.slos if s.stat]
        pr = [f"{s.key} <= {s.limit_ms:g}" for s in self.slos if s.stat is None]
        if pr:
            parts.append(f"{' and '.join(pr)} for {self.attainment:.4g} of requests")
        return ", ".join(parts)

    def sample_note(self, n: int) -> str | None:
        """A warning when `n` requests per load point are too few for a tail SLO: a pX over
        fewer than 100 / (100 - X) values is interpolated between the slowest ones, so the
        verdict rests on one or two requests."""
        short = [s.key for s in self.slos if s.stat in _MIN_N and n < _MIN_N[s.stat]]
        if not short:
            return None
        need = max(_MIN_N[s.stat] for s in self.slos if s.key in short)  # type: ignore[index]
        return (f"{', '.join(short)} judged over {n} requests: too few for that tail (a verdict "
                f"resting on the slowest one or two); use --num-prompts >= {need}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the sweep's `--output` and summaries)."""
        return {"slos": {s.key: s.limit_ms for s in self.slos}, "attainment": self.attainment}

    def check(self, summary: Mapping[str, Any]) -> SloCheck:
        """Whether the load point `summary` (docs/METRICS.md) meets every SLO."""
        completed = summary.get("completed") or 0
        failed = summary.get("failed") or 0
        issued = summary.get("issued")
        issued = issued if isinstance(issued, int) and issued > 0 else completed + failed
        failed_share = failed / issued if issued else 1.0
        values: dict[str, float | None] = {}
        ratios: list[float | None] = []
        reasons: list[str] = []
        for s in self.slos:
            if s.stat is None:
                continue
            stat_obj = summary.get(s.metric)
            v = stat_obj.get(s.stat) if isinstance(stat_obj, Mapping) else None
            values[s.key] = v
            allowed = _FAILED_SHARE[s.stat]
            if failed_share > allowed:
                ratios.append(math.inf)
                reasons.append(f"{s.key}: {failed_share:.1%} of requests failed, more than the "
                               f"{allowed:.0%} {s.stat} leaves")
            elif v is None:
                ratios.append(None)
                reasons.append(f"{s.key}: not measured at this load point")
            else:
                ratios.append(v / s.limit_ms)
                if v > s.limit_ms:
                    reasons.append(f"{s.key} = {v:.4g} > {s.limit_ms:g}")
        pr = self.per_request
        if pr:
            share = _attainment(summary, pr, issued)
            values["attainment"] = share
            if share is None:
                ratios.append(None)
                reasons.append("per-request SLOs: the load point's goodput was not counted "
                               f"against {pr}")
            else:
                miss, allowed = 1.0 - share, 1.0 - self.attainment
                ratios.append(miss / allowed if allowed > 0 else (math.inf if miss > 0 else 0.0))
                if share < self.attainment - 1e-12:
                    reasons.append(f"{share:.1%} of requests met {pr}, fewer than "
                                   f"{self.attainment:.4g}")
        known = [r for r in ratios if r is not None]
        ratio = max(known) if len(known) == len(ratios) else None
        return SloCheck(met=not reasons, ratio=ratio, values=values, reasons=tuple(reasons))


def _attainment(summary: Mapping[str, Any], per_request: dict[str, float],
                issued: int) -> float | None:
    """Share of issued requests meeting every per-request SLO, from the goodput the load point
    counted (None when it was counted against other SLOs or not at all)."""
    slo = summary.get("goodput_slo")
    if not isinstance(slo, Mapping) or dict(slo) != per_request:
        return None
    if not issued:
        return 0.0
    gp, dur = summary.get("goodput_req_s"), summary.get("duration_s")
    if gp is None or not dur:
        return 0.0 if not summary.get("completed") else None
    return min(1.0, round(gp * dur) / issued)


def parse_slo(text: str | None) -> SloSet | None:
    """`ttft_p99_ms=2000,tpot_p99_ms=50` (percentile SLOs), `ttft:500 tpot:50` or
    `ttft_ms=500,tpot_ms=50` (per-request SLOs, vLLM's goodput spelling), `attainment=0.9`;
    None for no text."""
    if text is None or not text.strip():
        return None
    slos: list[Slo] = []
    attainment = 0.99
    for k, v in split_pairs(text, "--slo", _EXAMPLE):
        try:
            num = float(v)
        except ValueError:
            raise UserError(f"--slo {k}={v}: {v!r} is not a number") from None
        if k == "attainment":
            attainment = num
            continue
        m = _KEY_RE.fullmatch(k)
        if m is None:
            raise UserError(f"--slo key {k!r} is not an SLO; write METRIC[_STAT]_ms with METRIC in "
                            "ttft, tpot, itl, e2e and STAT in mean, median, p90, p95, p99, "
                            f"e.g. {_EXAMPLE}")
        stat = _STATS[m.group(2)] if m.group(2) else None
        slos.append(Slo(metric=_METRICS[m.group(1)], stat=stat, limit_ms=num))
    return SloSet(slos=tuple(slos), attainment=attainment)
