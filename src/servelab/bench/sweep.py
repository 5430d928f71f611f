"""Capacity search: the largest request rate a server sustains while meeting every SLO,
bracketed between two measured rates (docs/METRICS.md, "Capacity under SLOs").

The search, GuideLLM's `sweep` profile extended with a root search on the SLOs:

1. **synchronous**: one request at a time (closed loop, concurrency 1): the lightest load,
   and its request rate. If the SLOs fail here no load can meet them: capacity 0.
2. **throughput**: every request at once (`rate=inf`): the saturated request rate, the most
   the server can complete per second.
3. **grid**: `grid_rates` open-loop rates evenly spaced strictly between the two (the
   latency-throughput curve a report draws).
4. **refine**: bisection between the largest rate that met every SLO and the smallest rate
   above it that missed one, until the bracket is narrower than `precision` x its low end. When
   every grid rate met the SLOs, the saturated rate itself is tried; when it meets them too,
   capacity is "at least the saturated rate" (a finite run can outlast a queue that grows
   slowly; no sustained rate exceeds what the server completes per second).

An open-loop point whose load-point telemetry flags it `above_saturation` (its queue grew
throughout: the server completes fewer requests than arrive, telemetry/steady.py) misses its
SLOs whatever its latencies read (`SweepConfig.saturation_fails`): a finite run of such a rate
ends before its latencies do, so a short point's median can still look fine (the scripted
server's 15%-high capacity of issue 36). The reason names it.

Capacity is reported as the bracket `[low, high]`, never one number. The bracket is the FIRST
crossing: a rate above `high` that met the SLOs again (noise, or a server whose latency is not
monotone in load) is noted, not used. Every measurement, sync and saturation included, counts
against `max_points`; hitting it leaves the bracket wider than asked (status `unresolved`).

Bisection (not interpolation) keeps the number of load points predictable: from a grid step of
width w at rate r, it takes ceil(log2(w / (precision x r))) refinements.

The measuring is the caller's: `sweep(measure, cfg)` calls `measure(LoadPoint)` and reads the
returned load-point summary, so `servelab bench --sweep` and experiments share it; `search(cfg)`
is the same search as a generator, for callers that interleave several (paired sweeps).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from servelab.bench.config import LoadPoint
from servelab.bench.slo import SloCheck, SloSet
from servelab.errors import UserError

Measure = Callable[[LoadPoint], Mapping[str, Any]]
ROLES = ("synchronous", "throughput", "grid", "refine")
STATUSES = ("bracketed", "unresolved", "above_saturation", "unmet_at_synchronous", "none_met")


@dataclass(frozen=True, slots=True)
class SweepConfig:
    """How a sweep searches: the SLOs (None: only the synchronous, saturated and grid points,
    no capacity), the relative precision of the bracket, the grid size, a cap on load points,
    and the burstiness of the open-loop rates."""

    slo: SloSet | None = None
    precision: float = 0.1
    grid_rates: int = 3
    max_points: int = 12
    burstiness: float = 1.0
    saturation_fails: bool = True  # an open-loop point flagged above saturation misses

    def __post_init__(self) -> None:
        if not 0.001 <= self.precision <= 1.0:
            raise UserError(f"--sweep-precision {self.precision}: give a relative width in "
                            "[0.001, 1], e.g. 0.05 for a bracket within 5%")
        if self.grid_rates < 0:
            raise UserError(f"--sweep-rates must be >= 0, got {self.grid_rates}")
        if self.max_points < 2 + self.grid_rates:
            raise UserError(f"--sweep-max-points {self.max_points} leaves no room for the "
                            f"synchronous, saturated and {self.grid_rates} grid load points; "
                            f"give at least {2 + self.grid_rates}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise UserError(f"--burstiness must be > 0 (1 = Poisson), got {self.burstiness}")


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One measured load point of a sweep and how it fared against the SLOs."""

    role: str  # one of ROLES
    load: LoadPoint
    summary: Mapping[str, Any]
    check: SloCheck | None

    @property
    def offered_req_s(self) -> float | None:
        """The open-loop rate asked for (None for the synchronous point, inf for throughput)."""
        return self.load.request_rate

    @property
    def achieved_req_s(self) -> float | None:
        """Completed requests per second, as measured."""
        return self.summary.get("request_throughput_req_s")


def bracket_text(status: str, low: float | None, high: float | None, *, digits: int = 4,
                 sep: str = " - ") -> str:
    """A capacity bracket [low, high) req/s as text, the one renderer of its statuses (the
    sweep's line here; each run's bracket in the experiment's report): `low - high`, `>= low`
    above saturation or with `high` open (None, inf), `< high` when nothing met (`low` 0 or
    None), `0` when nothing met and no rate bounds it."""
    def num(x: float | None) -> str:
        return f"{x or 0.0:.{digits}g}"

    open_high = high is None or not math.isfinite(high)
    if status == "above_saturation":
        return f">= {num(low)}"
    if not low:
        return "0" if open_high else f"< {num(high)}"
    return f">= {num(low)}" if open_high else f"{num(low)}{sep}{num(high)}"


@dataclass(frozen=True, slots=True)
class Capacity:
    """The SLO capacity in requests/s: `low` met every SLO, `high` (the smallest measured rate
    above it) missed one. `high` None: no measured rate missed (status `above_saturation`);
    `low` 0.0: none met (`unmet_at_synchronous`, `none_met`); None: `unresolved` before any
    open-loop rate met."""

    status: str  # one of STATUSES
    low_req_s: float | None
    high_req_s: float | None
    precision: float
    notes: tuple[str, ...] = ()

    @property
    def width(self) -> float | None:
        """(high - low) / low: the bracket's relative width (None when open or low is 0)."""
        if self.low_req_s is None or self.high_req_s is None or self.low_req_s <= 0:
            return None
        return (self.high_req_s - self.low_req_s) / self.low_req_s

    def describe(self) -> str:
        """One line for people: the bracket (`bracket_text`) and what its status means."""
        lo, hi = self.low_req_s, self.high_req_s
        if self.status == "unresolved":  # an end may be unknown yet: '?'
            w = self.width
            return (f"{'?' if lo is None else f'{lo:.4g}'} - {'?' if hi is None else f'{hi:.4g}'}"
                    f" req/s (unresolved: bracket width {'open' if w is None else f'{w:.1%}'}, "
                    f"asked {self.precision:.1%})")
        why = {
            "bracketed": f"bracket width {self.width:.1%} <= {self.precision:.1%}"
            if self.width is not None else "",
            "above_saturation": "every rate met the SLOs, up to the saturated rate",
            "unmet_at_synchronous": "the SLOs fail even with one request at a time",
        }.get(self.status, "no measured rate met the SLOs")
        return f"{bracket_text(self.status, lo, hi)} req/s ({why})"

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "low_req_s": self.low_req_s, "high_req_s": self.high_req_s,
                "width": self.width, "precision": self.precision, "notes": list(self.notes)}


@dataclass(frozen=True, slots=True)
class SweepResult:
    """Every load point in the order measured, and the capacity (None without SLOs)."""

    points: tuple[SweepPoint, ...]
    capacity: Capacity | None
    synchronous_req_s: float
    saturated_req_s: float
    notes: tuple[str, ...] = field(default=())


def _round(rate: float) -> float:
    """4 significant digits: readable load keys (`rate=12.35`), far below any precision asked."""
    return float(f"{rate:.4g}")


def _rate_of(p: SweepPoint, role: str) -> float:
    r = p.achieved_req_s
    if r is None or not r > 0:
        reasons = ", ".join(f"{k} x{v}" for k, v in (p.summary.get("failure_reasons") or {}).items())
        raise UserError(f"sweep: the {role} load point ({p.load.key}) completed no request"
                        + (f" ({reasons})" if reasons else "")
                        + "; check the server and --request-timeout before sweeping")
    return float(r)


Step = tuple[str, LoadPoint]  # (role, load point) a search asks to have measured
Search = Generator[Step, Mapping[str, Any], SweepResult]


def sweep(measure: Measure, cfg: SweepConfig,
          on_point: Callable[[SweepPoint], None] | None = None) -> SweepResult:
    """Run the capacity search (module docstring); `on_point` sees each point as it finishes
    (to store or print it)."""
    it = search(cfg, on_point)
    try:
        _, load = next(it)
        while True:
            _, load = it.send(measure(load))
    except StopIteration as stop:
        return stop.value


def search(cfg: SweepConfig, on_point: Callable[[SweepPoint], None] | None = None) -> Search:
    """The capacity search as a generator: it yields `(role, LoadPoint)`, is sent the measured
    summary, and returns the SweepResult. Who measures, and when, is the caller's: `sweep` runs
    one search to its end; an experiment alternates the searches of two arms point by point
    (experiment/run/sweeps.py), so that both meet the same minutes of a drifting machine."""
    points: list[SweepPoint] = []

    def run(role: str, load: LoadPoint) -> Generator[Step, Mapping[str, Any], SweepPoint]:
        summary = yield role, load
        p = SweepPoint(role=role, load=load, summary=summary, check=judge(cfg, role, summary))
        points.append(p)
        if on_point is not None:
            on_point(p)
        return p

    def rate(r: float, role: str) -> Generator[Step, Mapping[str, Any], SweepPoint]:
        return (yield from run(role, LoadPoint(request_rate=_round(r), burstiness=cfg.burstiness)))

    sync = yield from run("synchronous", LoadPoint(concurrency=1))
    r_sync = _rate_of(sync, "synchronous")
    r_sat = _rate_of((yield from run("throughput", LoadPoint(request_rate=math.inf))), "throughput")
    notes: list[str] = []
    if r_sat < r_sync:
        notes.append(f"the saturated rate ({r_sat:.4g} req/s) is below the synchronous one "
                     f"({r_sync:.4g}): the server gains nothing from concurrency")
    top = max(r_sat, r_sync)

    def result(capacity: Capacity | None) -> SweepResult:
        return SweepResult(points=tuple(points), capacity=capacity, synchronous_req_s=r_sync,
                           saturated_req_s=r_sat, notes=tuple(notes))

    if cfg.slo is not None and sync.check is not None and not sync.check.met:
        return result(Capacity("unmet_at_synchronous", 0.0, None, cfg.precision,
                               ("at concurrency 1: " + "; ".join(sync.check.reasons),)))
    if top > r_sync * (1 + cfg.precision):  # else the grid would be narrower than the precision
        for i in range(1, cfg.grid_rates + 1):
            yield from rate(r_sync + (top - r_sync) * i / (cfg.grid_rates + 1), "grid")
    if cfg.slo is None:
        return result(None)
    capacity = yield from _refine(points, cfg, top, rate)
    n = min((p.summary.get("completed") or 0) for p in points)
    short = cfg.slo.sample_note(n)
    if short:
        notes.append(short)
    return result(capacity)


def judge(cfg: SweepConfig, role: str, summary: Mapping[str, Any]) -> SloCheck | None:
    """The SLO verdict on one point: the SLOs, and for an open-loop point (grid, refine) that
    its telemetry flags above saturation, a miss that names it (module docstring)."""
    if cfg.slo is None:
        return None
    check = cfg.slo.check(summary)
    why = rising_queue(summary) if cfg.saturation_fails and role in ("grid", "refine") else None
    if why is None:
        return check
    return SloCheck(met=False, ratio=check.ratio, values=check.values,
                    reasons=(*check.reasons, why))


def rising_queue(summary: Mapping[str, Any]) -> str | None:
    """Why a load point's latencies are a transient, not the rate's: flagged above saturation,
    or unsteady with its queue (or in-flight count) or its TTFT, which holds the queue's wait,
    trending up over the whole load (it never reached a steady state at that rate); None
    otherwise, and for points without telemetry."""
    st = summary.get("steadiness")
    if not isinstance(st, dict):
        return None
    if st.get("status") == "above_saturation":
        return f"above saturation: {st.get('reason')}"
    trends = st.get("trends") or {}
    for name, what in (("queue", "the queue"), ("ttft_ms", "TTFT (the wait for a slot)")):
        tr = trends.get(name) or {}
        if st.get("status") == "unsteady" and tr.get("direction") == "up":
            return (f"unsteady: {what} rose all along ({tr.get('slope_per_s', 0):+.3g}/s), no "
                    "steady state at this rate")
    return None


def first_crossing(rated: Iterable[tuple[float, bool]]
                   ) -> tuple[float | None, float | None, tuple[str, ...]]:
    """(rate, met every SLO) pairs -> (low, high, notes): `high` the smallest rate that missed,
    `low` the largest rate below it that met (None where there is none). Reusable on stored
    load points judged against other SLOs."""
    met = sorted(r for r, ok in rated if ok)
    missed = sorted(r for r, ok in rated if not ok)
    if not missed:
        return (met[-1] if met else None), None, ()
    hi = missed[0]
    below = [r for r in met if r < hi]
    above = [r for r in met if r > hi]
    notes: tuple[str, ...] = ()
    if above:
        notes = (f"{len(above)} rate(s) above {hi:.4g} req/s met the SLOs again (up to "
                 f"{above[-1]:.4g}): noise or a non-monotone server; the bracket is the first "
                 "crossing",)
    return (below[-1] if below else None), hi, notes


def _refine(points: list[SweepPoint], cfg: SweepConfig, top: float,
            rate: Callable[[float, str], Generator[Step, Mapping[str, Any], SweepPoint]]
            ) -> Generator[Step, Mapping[str, Any], Capacity]:
    """Bisect the first SLO crossing among the open-loop rates until it is `precision` wide."""
    floor = _round(top) * 1e-3  # below this the answer is "none", not a rate
    while True:
        open_loop = [p for p in points if p.role in ("grid", "refine") and p.check is not None]
        met = sorted(p.load.request_rate for p in open_loop if p.check.met)  # type: ignore[union-attr,misc]
        missed = sorted(p.load.request_rate for p in open_loop if not p.check.met)  # type: ignore[union-attr,misc]
        full = len(points) >= cfg.max_points
        if not missed:
            if _round(top) not in met:
                if not full:
                    yield from rate(top, "refine")
                    continue
                return Capacity("unresolved", met[-1] if met else None, None, cfg.precision,
                                ("--sweep-max-points was reached before the saturated rate "
                                 "was tried",))
            return Capacity("above_saturation", met[-1], None, cfg.precision,
                            (f"every measured rate met the SLOs, up to {met[-1]:.4g} req/s; "
                             "no sustained rate exceeds the saturated throughput",))
        lo, hi, notes = first_crossing([(r, True) for r in met] + [(r, False) for r in missed])
        assert hi is not None
        if lo is not None and hi - lo <= cfg.precision * lo:
            return Capacity("bracketed", lo, hi, cfg.precision, notes)
        nxt = _round((lo + hi) / 2 if lo is not None else hi / 2)
        if lo is None and nxt < floor:
            return Capacity("none_met", 0.0, hi, cfg.precision, notes)
        if full or nxt in (lo, hi):
            return Capacity("unresolved", lo, hi, cfg.precision, notes)
        yield from rate(nxt, "refine")
