"""Warm-up until steady (docs/METRICS.md, "Warm-up until steady"): an open loop that sends at
its rate from the first request, watches its own in-flight count and TTFTs (and the server's
scraped queue) with the online steadiness test (telemetry/steady.py `Online`), measures the
next `num_prompts` requests once the trailing window is flat (or the warm-up's cap passed), and
keeps the load on (cool-down) until every measured request has answered; and the summary
fields that say how it went. bench/run.py calls it for open-loop points at a finite rate when
`BenchConfig.warmup_until_steady` is set.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servelab.bench import spec_metrics
from servelab.bench.client import RawResult
from servelab.bench.load import OnDone, Send
from servelab.bench.workload import RequestSpec
from servelab.telemetry.point import PointTelemetry, verdict_json
from servelab.telemetry.steady import Online, Probe, Steadiness

# called with "start" at the first measured send (not awaited before it: the send goes out on
# time) and "end" once the last measured request has answered (awaited, the cool-down's load
# still on): e.g. the /metrics reads that bracket the measured span
SpanHook = Callable[[str], Awaitable[None]]

def gamma_gaps(rate: float, burstiness: float, seed: int, chunk: int = 256
               ) -> Iterator[float]:
    """Endless inter-arrival gaps (s) of `arrival_offsets_s`'s law: the same draw, so a steady
    open loop's first gaps are those of an ordinary one with the same seed."""
    rng = np.random.default_rng(seed)
    while True:
        yield from rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=chunk)


@dataclass(slots=True)
class SteadyRun:
    """What a steady open loop did (`steady_open_loop`): the measured requests' results, the
    warm-up's and cool-down's counts (their results are not kept: requests still running when
    the last measured one answered were abandoned), the warm-up's length and verdict."""

    measured: list[RawResult]
    warmup_requests: int
    cooldown_requests: int
    abandoned: int
    warmup_s: float
    verdict: Steadiness
    background: list[RawResult]  # warm-up and cool-down requests that answered (for telemetry)
    t0_ns: int = 0  # the first send: the verdict's clock starts here
    # /metrics read at the measured span's ends ("start", "end"; `metrics_marks`)
    span_metrics: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def window_start_ns(self) -> int | None:
        """Where the steady window the warm-up ended on starts (None: no steady window)."""
        a = self.verdict.warmup_end_s
        return None if a is None else self.t0_ns + int(a * 1e9)


async def steady_open_loop(specs: Sequence[RequestSpec], pool: Sequence[RequestSpec],
                           rate: float, burstiness: float, seed: int, send: Send,
                           detector: Online, ttft_ms: Callable[[RawResult], float | None],
                           max_warmup_s: float, deadline_ns: int | None = None,
                           on_done: OnDone | None = None, check_s: float = 0.5,
                           sample_s: float = 0.1, t0_ns: int | None = None,
                           span_hook: SpanHook | None = None) -> SteadyRun:
    """An open loop at `rate` that warms up until steady, then measures `specs`, then cools
    down (docs/METRICS.md, "Warm-up until steady"). From the first send, pool prompts (reused
    cyclically) go out on the schedule while `detector` is fed the in-flight count every
    `sample_s` and each answer's TTFT, and asked every `check_s` whether the trailing window is
    steady (or `max_warmup_s` passed: then its `at_cap` verdict). The next len(specs) arrivals
    are the measured ones; after the last, pool prompts keep the load on until every measured
    request has answered (then `span_hook("end")`, its "start" having come at the first
    measured send); then whatever is still running is cancelled."""
    assert pool, "a steady open loop needs warm-up prompts"
    t0 = t0_ns if t0_ns is not None else time.perf_counter_ns()
    gaps = gamma_gaps(rate, burstiness, seed)
    measured: list[RawResult] = []
    background: list[RawResult] = []
    tasks: list[asyncio.Task[None]] = []
    n = {"in_flight": 0, "warm": 0, "cool": 0, "answered": 0}
    all_measured = asyncio.Event()  # every measured request sent and answered
    mtasks: list[asyncio.Task[None]] = []

    def secs(t_ns: int) -> float:
        return (t_ns - t0) / 1e9

    async def one(spec: RequestSpec, due: int, phase: str) -> None:
        n["in_flight"] += 1
        try:
            r = await send(spec)
        finally:
            n["in_flight"] -= 1
        r.t_due_ns = due
        if phase == "measured":
            measured.append(r)
            if on_done:
                on_done(r)
            n["answered"] += 1
            if n["answered"] == len(specs):
                all_measured.set()
        else:
            background.append(r)
            if phase == "warm":
                detector.add("ttft_ms", secs(r.t_start_ns), ttft_ms(r))

    verdict: Steadiness | None = None

    async def watch() -> None:
        nonlocal verdict
        last_check = 0.0
        while verdict is None:
            now = secs(time.perf_counter_ns())
            detector.add("in_flight", now, float(n["in_flight"]))
            if now >= max_warmup_s:
                verdict = detector.at_cap(now)
            elif now - last_check >= check_s:
                last_check = now
                verdict = detector.check(now)
            if verdict is None:
                await asyncio.sleep(sample_s)

    watcher = asyncio.create_task(watch())
    due, k, i = t0, 0, 0  # next due time, pool prompts used, measured specs sent
    t_measure = None
    started: asyncio.Task[None] | None = None  # span_hook("start")
    try:
        while specs and not all_measured.is_set():
            if deadline_ns is not None and due >= deadline_ns:
                break
            delay = (due - time.perf_counter_ns()) / 1e9
            if delay > 0:
                if i >= len(specs):  # cool-down: stop as soon as the measured ones are done
                    try:
                        await asyncio.wait_for(all_measured.wait(), delay)
                        break
                    except TimeoutError:
                        pass
                else:
                    await asyncio.sleep(delay)
            if verdict is not None and i < len(specs):
                if t_measure is None:
                    t_measure = due
                    if span_hook is not None:
                        started = asyncio.create_task(span_hook("start"))
                mtasks.append(asyncio.create_task(one(specs[i], due, "measured")))
                i += 1
            else:
                phase = "warm" if verdict is None else "cool"
                n[phase] += 1
                tasks.append(asyncio.create_task(one(pool[k % len(pool)], due, phase)))
                k += 1
            due += int(next(gaps) * 1e9)
        await asyncio.gather(*mtasks)  # the deadline stopped the load: let them answer
        if started is not None and span_hook is not None:
            await started
            await span_hook("end")
    finally:
        watcher.cancel()
        pending = [t for t in (*tasks, *mtasks) if not t.done()]
        for t in (*pending, *([started] if started is not None else [])):
            t.cancel()
        await asyncio.gather(watcher, *tasks, *mtasks, *([started] if started else []),
                             return_exceptions=True)
    if verdict is None:  # the deadline came first
        verdict = detector.at_cap(secs(time.perf_counter_ns()))
    return SteadyRun(measured=measured, warmup_requests=n["warm"], cooldown_requests=n["cool"],
                     abandoned=len(pending), warmup_s=secs(t_measure) if t_measure else
                     secs(time.perf_counter_ns()), verdict=verdict, background=background,
                     t0_ns=t0)


def metrics_marks(read: Callable[[], Awaitable[str | None]],
                  into: dict[str, dict[str, float]]) -> SpanHook:
    """A span hook that reads /metrics (`read`) at each end of the measured span into
    `into[phase]`: the speculative-decoding counters' deltas are then the measured span's, not
    the warm-up's and cool-down's too."""

    async def mark(phase: str) -> None:
        into[phase] = spec_metrics.parse_prometheus(await read())

    return mark


def queue_probe(tel: PointTelemetry | None, t0_ns: int) -> Probe | None:
    """The server's scraped queue so far, on the steady loop's clock (seconds after t0_ns)."""
    if tel is None or tel.scraper is None:
        return None
    srv, shift = tel.scraper.series, tel.to_series_s(t0_ns)

    def probe() -> tuple[list[float], list[float | None]]:
        col = srv.values["queued_requests"]
        n = min(len(srv.t_s), len(col))
        return [t - shift for t in srv.t_s[:n]], list(col[:n])

    return probe


def steady_fields(srun: SteadyRun | None) -> dict[str, Any]:
    """The summary fields of the warm-up until steady (docs/METRICS.md)."""
    if srun is None:
        return {"warmup_until_steady": False, "warmup_s": None, "warmup_requests": None,
                "cooldown_requests": None, "abandoned_requests": None, "warmup_verdict": None}
    v = srun.verdict
    return {"warmup_until_steady": True, "warmup_s": srun.warmup_s,
            "warmup_requests": srun.warmup_requests, "cooldown_requests": srun.cooldown_requests,
            "abandoned_requests": srun.abandoned,
            "warmup_verdict": verdict_json(v, "server" if "queue" in v.trends
                                           else "client_in_flight")}


def steady_verdict(srun: SteadyRun, summary: dict[str, Any]) -> None:
    """A warm-up that reached its cap without a steady window decides the point's steadiness
    (unsteady, or above saturation when the in-flight count or queue still grew), so that a
    sweep counts it as it counts any unsteady point; so does the warm-up's verdict when
    telemetry was off."""
    if srun.verdict.status != "steady" or summary.get("steadiness") is None:
        summary["steadiness"] = summary["warmup_verdict"]
        summary["above_saturation"] = srun.verdict.status == "above_saturation"
        if srun.verdict.status != "steady":
            summary["steady_window"] = None
