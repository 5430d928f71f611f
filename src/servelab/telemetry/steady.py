"""Was a load point steady? From its series over time (queue depth and throughput scraped from
the server, TTFT per request as the client saw it): a trend test per series, the warm-up and
the drain cut off, and an "above saturation" flag when the queue grows throughout.

The test (`trend`): the series is reduced to at most `max_points` window medians (robust to
bursts, and keeps the pairwise statistics cheap), then Mann-Kendall (Kendall's tau of value
against time, ties corrected; scipy) says whether there is a monotone trend at level `alpha`,
and Theil-Sen (median of pairwise slopes, with its rank-based CI) says how large. A trend
counts only when it is significant AND practically large: the change over the span, |slope| x
span, exceeds `min_rel_change` of the series' median level (with a floor per series: a queue
that goes from 0.1 to 0.3 requests is not growing). Both halves guard against the other's
failure: a long series makes a 1% drift significant, a short one makes noise look large.

The split (`assess`): the drain starts when the load stops (`load_end_s`, the last request
sent, when the caller knows it; else where the in-flight count begins its final decline). The
warm-up ends at the first candidate start (steps of a tenth of the load span, up to half of
it) from which no series trends, neither to its end nor over the first half of what is left
(where the tail of a ramp would hide in a long span); that span is the steady one. A point whose queue
trends up over the whole load span and still over its second half is `above_saturation`
(the server completes less than arrives); one with no flat span is `unsteady`.

Online (`Online`): while a client warms a server up at the target rate, it feeds the series it
sees as they come (its own in-flight count, each answer's TTFT at its send time, the server's
queue when scraped) and asks, every so often, whether the trailing half of what it has seen
shows no trend (the same `trend` and thresholds): steady from then on. At the warm-up's cap
`at_cap` gives the verdict on the same window: `above_saturation` when the in-flight count
or the queue still grows, else `unsteady`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy import stats

from servelab.telemetry.server import ServerSeries

Direction = Literal["up", "down", "flat"]
Status = Literal["steady", "unsteady", "above_saturation", "too_short"]


@dataclass(frozen=True, slots=True)
class SteadyConfig:
    """The test's settings, one place: `alpha` the Mann-Kendall level, `min_rel_change` the
    smallest change over the span (a fraction of the median) that counts as a trend,
    `min_points` the fewest samples a test is run on, `max_points` the window medians a long
    series is reduced to, `warmup_steps` the candidate warm-up ends (fractions of the span up
    to `max_warmup`), `floors` the smallest level per series (its units) a change is judged
    against."""

    alpha: float = 0.01
    min_rel_change: float = 0.2
    min_points: int = 8
    max_points: int = 200
    warmup_steps: int = 10
    max_warmup: float = 0.5
    floors: dict[str, float] = field(default_factory=lambda: {
        "queue": 1.0, "in_flight": 1.0, "throughput": 1e-9, "ttft_ms": 1.0})

    def __post_init__(self) -> None:
        assert 0 < self.alpha < 1 and self.min_rel_change >= 0, self
        assert 3 <= self.min_points <= self.max_points and self.warmup_steps >= 1, self
        assert 0 <= self.max_warmup < 1, self


@dataclass(frozen=True, slots=True)
class Trend:
    """One series' trend over a span: Theil-Sen `slope` (units per second) with its CI,
    Mann-Kendall `p`, the change over the span relative to the median `rel_change`, and the
    verdict `direction` (flat unless significant and large)."""

    slope: float
    slope_low: float
    slope_high: float
    p: float
    rel_change: float
    n: int
    direction: Direction


@dataclass(frozen=True, slots=True)
class Steadiness:
    """The verdict on a load point: `status`, the steady span [`warmup_end_s`, `drain_start_s`]
    (None when there is none), the trends over it (or over the whole load span when unsteady)
    and a one-line `reason`."""

    status: Status
    warmup_end_s: float | None
    drain_start_s: float | None
    trends: dict[str, Trend]
    reason: str

    @property
    def steady_span_s(self) -> float | None:
        if self.warmup_end_s is None or self.drain_start_s is None:
            return None
        return self.drain_start_s - self.warmup_end_s


def _clean(t: Sequence[float], y: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
    pairs = [(a, b) for a, b in zip(t, y, strict=True)
             if b is not None and math.isfinite(b) and math.isfinite(a)]
    if not pairs:
        return np.empty(0), np.empty(0)
    arr = np.asarray(sorted(pairs, key=lambda p: p[0]), dtype=float)
    return arr[:, 0], arr[:, 1]


def reduce(t: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `max_points` (time, value) medians over equal-count windows."""
    if len(t) <= max_points:
        return t, y
    parts = np.array_split(np.arange(len(t)), max_points)
    return (np.array([np.median(t[p]) for p in parts]),
            np.array([np.median(y[p]) for p in parts]))


def trend(t: Sequence[float], y: Sequence[float | None], floor: float = 0.0,
          cfg: SteadyConfig | None = None) -> Trend | None:
    """The trend of y over t (None values skipped); None with fewer than `min_points` samples."""
    cfg = cfg or SteadyConfig()
    tt, yy = _clean(t, y)
    tt, yy = reduce(tt, yy, cfg.max_points)
    if len(tt) < cfg.min_points or tt[-1] <= tt[0]:
        return None
    if np.all(yy == yy[0]):  # a constant: no trend, and Kendall's tau is undefined
        return Trend(0.0, 0.0, 0.0, 1.0, 0.0, len(tt), "flat")
    p = float(stats.kendalltau(tt, yy).pvalue)
    slope, _, lo, hi = stats.theilslopes(yy, tt, alpha=1 - cfg.alpha)
    level = max(abs(float(np.median(yy))), floor)
    rel = abs(slope) * (tt[-1] - tt[0]) / level if level > 0 else math.inf
    real = p < cfg.alpha and rel > cfg.min_rel_change and (lo > 0 or hi < 0)
    d: Direction = "flat" if not real else ("up" if slope > 0 else "down")
    return Trend(float(slope), float(lo), float(hi), p if math.isfinite(p) else 1.0,
                 float(rel), len(tt), d)


def drain_start(t: Sequence[float], in_flight: Sequence[float | None]) -> float | None:
    """Where the final decline of the in-flight count (running + queued) begins: the last
    sample at the peak of the trailing non-increasing run. None when it does not decline."""
    tt, yy = _clean(t, in_flight)
    if len(tt) < 2:
        return None
    i = len(yy) - 1
    while i > 0 and yy[i - 1] >= yy[i]:
        i -= 1
    while i < len(yy) - 1 and yy[i + 1] == yy[i]:  # the plateau before the decline is load
        i += 1
    return float(tt[i]) if yy[i] > yy[-1] and i < len(yy) - 1 else None


def _window(tt: Sequence[float], yy: Sequence[float | None], a: float, b: float
            ) -> tuple[list[float], list[float | None]]:
    keep = [(x, v) for x, v in zip(tt, yy, strict=True) if a <= x <= b]
    return [x for x, _ in keep], [v for _, v in keep]


def _trends(series: dict[str, tuple[Sequence[float], Sequence[float | None]]], a: float,
            b: float, cfg: SteadyConfig) -> dict[str, Trend]:
    out = {}
    for name, (tt, yy) in series.items():
        tr = trend(*_window(tt, yy, a, b), floor=cfg.floors.get(name, 0.0), cfg=cfg)
        if tr is not None:
            out[name] = tr
    return out


def assess(series: dict[str, tuple[Sequence[float], Sequence[float | None]]],
           load_end_s: float | None = None, load_start_s: float = 0.0,
           in_flight: tuple[Sequence[float], Sequence[float | None]] | None = None,
           cfg: SteadyConfig | None = None) -> Steadiness:
    """Steadiness of one load point. `series`: name -> (times s, values), e.g. `queue`
    (queued requests, scraped), `throughput` (completions or tokens per second), `ttft_ms`
    (per request, at its send time); all on one clock. `load_end_s`: when the last request was
    sent (else the drain is found from `in_flight`, else the series' end)."""
    cfg = cfg or SteadyConfig()
    ends = [max(tt) for tt, _ in series.values() if len(tt)]
    if not ends:
        return Steadiness("too_short", None, None, {}, "no samples")
    end = load_end_s
    if end is None and in_flight is not None:
        end = drain_start(*in_flight)
    if end is None:
        end = max(ends)
    span = end - load_start_s
    whole = _trends(series, load_start_s, end, cfg)
    if not whole:
        return Steadiness("too_short", None, end, {},
                          f"fewer than {cfg.min_points} samples in the load span")
    q = whole.get("queue")
    if q is not None and q.direction == "up":
        late = _trends({"queue": series["queue"]}, load_start_s + span / 2, end, cfg)
        if "queue" in late and late["queue"].direction == "up":
            return Steadiness("above_saturation", None, end, whole,
                              f"queue grows throughout: {q.slope:+.3g} req/s over "
                              f"{span:.3g} s, still {late['queue'].slope:+.3g} in its second half")
    for k in range(int(cfg.warmup_steps * cfg.max_warmup) + 1):
        start = load_start_s + span * k / cfg.warmup_steps
        tr = _trends(series, start, end, cfg)
        head = _trends(series, start, (start + end) / 2, cfg)  # a warm-up's tail lives here
        if tr and all(x.direction == "flat" for x in (*tr.values(), *head.values())):
            return Steadiness("steady", start, end, tr,
                              f"no trend from {start:.3g} s to {end:.3g} s"
                              + (f" (warm-up {start - load_start_s:.3g} s)" if k else ""))
    moving = ", ".join(f"{n} {x.direction} ({x.slope:+.3g}/s)" for n, x in whole.items()
                       if x.direction != "flat") or "trends in every candidate span"
    return Steadiness("unsteady", None, end, whole,
                      f"no steady span after up to {cfg.max_warmup:.0%} warm-up: {moving}")


def server_series(s: ServerSeries) -> tuple[dict[str, tuple[list[float], list[float | None]]],
                                           tuple[list[float], list[float | None]]]:
    """The inputs of `assess` from a scraped series: `queue` (queued requests), `throughput`
    (generated tokens per second, each interval's rate at its midpoint) when the server counts
    tokens, and the in-flight count (running + queued) that locates the drain."""
    t = list(s.t_s)
    out: dict[str, tuple[list[float], list[float | None]]] = {
        "queue": (t, s.gauge("queued_requests"))}
    rate = s.rate("generation_tokens")
    if any(r is not None for r in rate):
        out["throughput"] = ([(a + b) / 2 for a, b in zip(t, t[1:], strict=False)], rate)
    run, q = s.gauge("running_requests"), s.gauge("queued_requests")
    inflight = [None if a is None or b is None else a + b for a, b in zip(run, q, strict=True)]
    return out, (t, inflight)


Probe = Callable[[], tuple[list[float], list[float | None]]]


@dataclass(slots=True)
class Online:
    """The online steadiness test of a warm-up (module docstring). Times are seconds after the
    warm-up's first send. `add(name, t, v)` feeds a series (`in_flight`, `ttft_ms`, ...);
    `queue` (optional) returns the server's scraped queue on the same clock. A verdict is
    given on the trailing half of the warm-up so far, once that half spans `min_window_s`,
    and only when the in-flight count has enough samples there to be tested."""

    cfg: SteadyConfig = field(default_factory=SteadyConfig)
    min_window_s: float = 5.0
    queue: Probe | None = None
    series: dict[str, tuple[list[float], list[float | None]]] = field(default_factory=dict)

    def add(self, name: str, t: float, v: float | None) -> None:
        tt, yy = self.series.setdefault(name, ([], []))
        tt.append(t)
        yy.append(v)

    def _window(self, now: float) -> tuple[float, dict[str, Trend]]:
        a = now / 2
        series = dict(self.series)
        if self.queue is not None:
            qt, qv = self.queue()
            if sum(1 for t, v in zip(qt, qv, strict=True) if v is not None and a <= t <= now) \
                    >= self.cfg.min_points:
                series["queue"] = (qt, qv)
        return a, _trends(series, a, now, self.cfg)

    def check(self, now: float) -> Steadiness | None:
        """`steady` when no series trends over [now / 2, now]; None while one does, or while
        that window is shorter than `min_window_s` (the warm-up lasts at least twice that: on
        a window of 2 s the in-flight count's noise hid a ramp that went on for a minute)."""
        if now / 2 < self.min_window_s:
            return None
        a, tr = self._window(now)
        if "in_flight" not in tr or any(x.direction != "flat" for x in tr.values()):
            return None
        return Steadiness("steady", a, now, tr, f"no trend from {a:.3g} s to {now:.3g} s of "
                          f"the warm-up ({', '.join(sorted(tr))})")

    def at_cap(self, now: float) -> Steadiness:
        """The verdict when the warm-up's time ran out: steady if the window is flat now,
        else `above_saturation` when the in-flight count or the queue grows, `unsteady`."""
        done = self.check(now)
        if done is not None:
            return done
        a, tr = self._window(now)
        moving = ", ".join(f"{n} {x.direction} ({x.slope:+.3g}/s)" for n, x in tr.items()
                           if x.direction != "flat") or "a trend in every window checked"
        grows = any(tr[n].direction == "up" for n in ("in_flight", "queue") if n in tr)
        return Steadiness("above_saturation" if grows else "unsteady", None, None, tr,
                          f"no steady window in a {now:.3g}-s warm-up (from {a:.3g} s: "
                          f"{moving})")
