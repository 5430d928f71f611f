"""Telemetry of one load point: the engine's /metrics scraped (server.py) and the GPUs sampled
(gpu.py) from just before the first request to just after the last answer, then summarised:
steadiness (steady.py), the largest queue, energy per output token (energy.py) and the
throttle reasons seen.

bench/run.py starts a `PointTelemetry` around the load and calls `finish` with the requests'
send times and TTFTs; the result is the stored series (`series`, the load point's side file)
and the summary fields (`summary`, docs/METRICS.md "Telemetry of a load point").

Clocks: the scraper and the sampler count seconds from their own start (time.monotonic); the
requests are stamped with time.perf_counter_ns. Both readings are taken together at start, so
a request's send time maps onto the series' clock (`to_series_s`). Everything stored is on the
scraper's clock, its zero the scrape that precedes the load.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from servelab.telemetry import energy, steady
from servelab.telemetry.gpu import GpuSampler, GpuSeries
from servelab.telemetry.server import Scraper, ServerSeries

DEFAULT_SCRAPE_INTERVAL_S = 1.0
SERIES_VERSION = 1
# a load sent in less than this has no time axis to trend along (rate=inf sends 100 requests
# in ~5 ms): its verdict is too_short, not a queue "growing" at 20,000 req/s
MIN_LOAD_SPAN_S = 1.0


@dataclass(frozen=True, slots=True)
class Sent:
    """One request as the steadiness test needs it: when it was sent and answered
    (perf_counter_ns) and its TTFT (ms; None when it failed)."""

    t_start_ns: int
    t_end_ns: int
    ttft_ms: float | None


@dataclass(slots=True)
class PointTelemetry:
    """Scrape `metrics_url` and sample the GPUs every `interval_s` between start() and finish().
    `gpus`: NVML indices (None: every GPU NVML sees); `nvml` a stand-in for tests."""

    metrics_url: str
    interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    gpus: list[int] | None = None
    nvml: Any = None
    headers: dict[str, str] | None = None  # sent with every scrape (Authorization)
    scraper: Scraper | None = None
    sampler: GpuSampler | None = None
    perf0_ns: int = 0
    mono0: float = 0.0
    stopped: bool = field(default=False)

    def start(self) -> PointTelemetry:
        self.scraper = Scraper(self.metrics_url, self.interval_s, headers=self.headers).start()
        self.sampler = GpuSampler(self.gpus, self.interval_s, nvml=self.nvml).start()
        self.perf0_ns, self.mono0 = time.perf_counter_ns(), time.monotonic()
        return self

    def to_series_s(self, t_ns: int) -> float:
        """A perf_counter_ns instant in seconds on the scraper's clock."""
        assert self.scraper is not None
        return (t_ns - self.perf0_ns) / 1e9 + (self.mono0 - self.scraper.t0)

    def stop(self) -> tuple[ServerSeries, GpuSeries]:
        """Stop both threads (each takes one last reading); idempotent."""
        assert self.scraper is not None and self.sampler is not None
        srv, gpu = self.scraper.stop(), self.sampler.stop()
        self.stopped = True
        return srv, gpu

    def finish(self, sent: Sequence[Sent], t_end_ns: int, output_tokens: int | None,
               background: Sequence[Sent] = (), span_start_ns: int | None = None,
               measured_span: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
        """Stop, then (series to store, summary fields) for the load whose requests are `sent`
        and whose last answer came at `t_end_ns`. `background`: requests sent around the
        measured ones (a steady point's warm-up and cool-down), never in its statistics; with
        `span_start_ns` (where a steady point's warm-up window began) the steadiness test
        spans from there, their in-flight count and TTFTs included. `measured_span`: the
        prefix-cache hit rate is the measured requests' span's alone (a steady point)."""
        srv, gpu = self.stop()
        assert self.scraper is not None and self.sampler is not None
        shift = self.sampler.t0 - self.scraper.t0  # sampler clock -> scraper clock
        load = [self.to_series_s(s.t_start_ns) for s in sent]
        t_a = min(load) if load else None
        t_b = self.to_series_s(t_end_ns) if load else None
        reqs = [(t, self.to_series_s(s.t_end_ns), s.ttft_ms) for t, s in zip(load, sent,
                                                                           strict=True)]
        bg = [(self.to_series_s(s.t_start_ns), self.to_series_s(s.t_end_ns), s.ttft_ms)
              for s in background]
        summary = summarize(srv, gpu, sent=reqs, t_end_s=t_b, gpu_shift_s=shift,
                            output_tokens=output_tokens, background=bg,
                            span_start_s=None if span_start_ns is None
                            else self.to_series_s(span_start_ns),
                            measured_span=measured_span)
        series = {"version": SERIES_VERSION, "clock": "seconds after the first scrape",
                  "load_start_s": t_a, "load_last_sent_s": max(load) if load else None,
                  "load_end_s": t_b, "gpu_clock_offset_s": shift,
                  "server": srv.to_json(), "gpu": gpu.to_json()}
        return series, summary


Req = tuple[float, float, float | None]  # (sent s, answered s, TTFT ms) on the scraper's clock


def summarize(srv: ServerSeries, gpu: GpuSeries, *, sent: Sequence[Req],
              t_end_s: float | None, gpu_shift_s: float = 0.0,
              output_tokens: int | None = None, cfg: steady.SteadyConfig | None = None,
              background: Sequence[Req] = (), span_start_s: float | None = None,
              measured_span: bool = False) -> dict[str, Any]:
    """The summary fields of a load point's telemetry (docs/METRICS.md). `sent`: each request's
    (send time s, TTFT ms) on the scraper's clock; `t_end_s` the last answer; `gpu_shift_s`
    what to add to a GPU sample's time to put it on the scraper's clock."""
    cfg = cfg or steady.SteadyConfig()
    served = {k for k, v in srv.values.items() if any(x is not None for x in v)}
    queue = [x for x in srv.gauge("queued_requests") if x is not None]
    out: dict[str, Any] = {
        "telemetry": {
            "scrape_interval_s": srv.interval_s, "scrapes": len(srv.t_s),
            "failed_scrapes": sum(e is not None for e in srv.errors),
            "served": sorted(served), "scrape_cpu_share": srv.cpu_share,
            "gpu_status": gpu.status, "gpus": [g.get("name") for g in gpu.gpus] or None,
        },
        "max_queued_requests": max(queue) if queue else None,
    }
    # a steady point's hit rate is its measured span's (first measured send to last answer):
    # the warm-up's and cool-down's requests, cycling their pool, would inflate it
    t_a = min(r[0] for r in sent) if sent else None
    span = None
    if measured_span:  # no measured request: an empty span, no rate
        span = (t_a, t_end_s) if t_a is not None and t_end_s is not None else (1.0, 0.0)
    out["prefix_cache_hit_rate"], out["prefix_cache_hit_rate_source"] = prefix_hit_rate(srv, span)
    out["steadiness"] = (steadiness(srv, sent, cfg, background, span_start_s).to_json()
                         if sent else None)
    out["above_saturation"] = (out["steadiness"]["status"] == "above_saturation"
                               if out["steadiness"] else None)
    en, tok_src = None, "client"
    if t_a is not None and t_end_s is not None and gpu.available:
        # the sample just before the load and just after: the window covers the whole load
        lo = max((s.t_s for s in gpu.samples if s.t_s + gpu_shift_s <= t_a), default=None)
        hi = min((s.t_s for s in gpu.samples if s.t_s + gpu_shift_s >= t_end_s), default=None)
        tokens = output_tokens or None
        if measured_span:
            # inside a steady load the GPUs also serve the warm-up's and cool-down's requests:
            # the tokens they paid for are the server's, generated over the same window
            tokens, tok_src = window_tokens(srv, lo, hi, gpu_shift_s), "server_counter"
        en = energy.window(gpu, lo, hi, output_tokens=tokens)
    out["energy"] = None if en is None else {
        "joules": en.joules, "seconds": en.seconds, "source": en.source,
        "mean_power_w": en.mean_power_w, "output_tokens": en.output_tokens,
        "output_tokens_source": tok_src}
    out["j_per_output_token"] = en.j_per_token if en else None
    out["output_tokens_per_j"] = en.tokens_per_j if en else None
    thr = gpu.throttling() if gpu.available else {}
    out["throttle_reasons"] = ({str(g): v for g, v in thr.items() if v} or {}) \
        if gpu.available else None
    return out


def window_tokens(srv: ServerSeries, lo: float | None, hi: float | None,
                  gpu_shift_s: float = 0.0) -> int | None:
    """The tokens the server generated between two GPU samples' times (sampler clock; +
    `gpu_shift_s` puts them on the scraper's): its generation-token counter read at both ends
    by linear interpolation between the scrapes around them (a steady load generates at a
    flat rate, so the interpolation is the rate's); None without a counter reading on both
    sides of each end, or across a reset."""
    if lo is None or hi is None:
        return None
    pts = [(t, v) for t, v in zip(srv.t_s, srv.gauge("generation_tokens"), strict=True)
           if v is not None]

    def at(t: float) -> float | None:
        for (t0, v0), (t1, v1) in zip(pts, pts[1:], strict=False):
            if t0 <= t <= t1 and t1 > t0:
                return None if v1 < v0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
        return None

    a, b = at(lo + gpu_shift_s), at(hi + gpu_shift_s)
    if a is None or b is None or b < a or any(v1 < v0 for (_, v0), (_, v1)
                                              in zip(pts, pts[1:], strict=False)):
        return None
    return round(b - a)


def prefix_hit_rate(srv: ServerSeries, span: tuple[float, float] | None = None
                    ) -> tuple[float | None, str | None]:
    """The engine's own prefix-cache hit rate over the load point, in prompt tokens: the ratio
    of the hit and query counters' deltas between the first and last scrape that served them
    (vLLM's counters, which the embedded engine serves too), else the mean of the engine's
    hit-rate gauge (SGLang's `cache_hit_rate`, a recent window); (None, None) when neither.
    With `span` (seconds on the scraper's clock) only the scrapes inside it count: fewer than
    two counters' scrapes there give no counter rate."""
    def col(name: str) -> list[float]:
        v = srv.values.get(name, [])
        return [x for t, x in zip(srv.t_s, v, strict=False) if x is not None
                and (span is None or span[0] <= t <= span[1])]

    q, h = col("prefix_cache_queries"), col("prefix_cache_hits")
    if len(q) >= 2 and len(h) >= 2 and q[-1] - q[0] > 0:
        return (h[-1] - h[0]) / (q[-1] - q[0]), "counters"
    g = col("prefix_cache_hit_rate_gauge")
    if g:
        return sum(g) / len(g), "gauge"
    return None, None


@dataclass(frozen=True, slots=True)
class _Verdict:
    s: steady.Steadiness
    queue_source: str | None

    def to_json(self) -> dict[str, Any]:
        s = self.s
        return {"status": s.status, "reason": s.reason, "warmup_end_s": s.warmup_end_s,
                "drain_start_s": s.drain_start_s, "steady_span_s": s.steady_span_s,
                "queue_source": self.queue_source,
                "trends": {k: {"direction": t.direction, "slope_per_s": t.slope, "p": t.p,
                               "rel_change": t.rel_change, "n": t.n}
                           for k, t in s.trends.items()}}


def verdict_json(s: steady.Steadiness, queue_source: str | None) -> dict[str, Any]:
    """A verdict as the summary's `steadiness` object (docs/METRICS.md)."""
    return _Verdict(s, queue_source).to_json()


def in_flight(reqs: Sequence[Req], t_a: float, t_b: float, n: int = 100
              ) -> tuple[list[float], list[float | None]]:
    """The client's own count of requests sent and not yet answered, at `n` instants evenly
    over [t_a, t_b]: exact, and as fine as asked, where a 1-s scrape of a 3-s load point has 3
    samples."""
    ts = [t_a + (t_b - t_a) * i / (n - 1) for i in range(n)] if t_b > t_a else [t_a]
    return ts, [float(sum(1 for a, b, _ in reqs if a <= t < b)) for t in ts]


def steadiness(srv: ServerSeries, reqs: Sequence[Req],
               cfg: steady.SteadyConfig | None = None, background: Sequence[Req] = (),
               span_start_s: float | None = None) -> _Verdict:
    """The steadiness test over the load span (first send to last send; a steady point's from
    where its warm-up's steady window began, `span_start_s`): the server's queue
    when its scrapes inside the span are enough for a trend test, else the client's in-flight
    count in its place (a queue that grows is an in-flight count that grows: arrivals exceed
    completions); the server's token throughput when it counts tokens; the client's TTFT by
    send time."""
    cfg = cfg or steady.SteadyConfig()
    t_a, t_b = min(r[0] for r in reqs), max(r[0] for r in reqs)
    everyone = [*reqs, *background]
    if span_start_s is not None:  # a steady point: from its warm-up's steady window on
        t_a = min(t_a, span_start_s)
        reqs = [r for r in everyone if t_a <= r[0] <= t_b]
    if t_b - t_a < MIN_LOAD_SPAN_S:
        return _Verdict(steady.Steadiness(
            "too_short", None, t_b, {}, f"the load was sent in {t_b - t_a:.3g} s "
            f"(< {MIN_LOAD_SPAN_S:g} s): no time axis to test"), None)
    series, _ = steady.server_series(srv)
    inside = sum(1 for t, q in zip(*series["queue"], strict=True)
                 if q is not None and t_a <= t <= t_b)
    src: str | None = "server"
    # a steady point asks whether requests pile up, running or queued: the client's exact
    # count (a server's queue stays 0 while its batch still has room, however many run)
    if inside < cfg.min_points or span_start_s is not None:
        series["queue"] = in_flight(everyone, t_a, t_b)
        src = "client_in_flight"
    ttft = [(a, v) for a, _, v in reqs if v is not None]
    if ttft:
        series["ttft_ms"] = ([t for t, _ in ttft], [v for _, v in ttft])
    return _Verdict(steady.assess(series, load_end_s=t_b, load_start_s=t_a, cfg=cfg), src)
