"""Load drivers: closed loop (a fixed number of requests in flight) and open loop (arrivals on a
schedule independent of how fast the server answers: seeded Poisson or gamma gaps, or a trace's
own clock, `replay_offsets_s`).

The open loop notes each request's due time on its result (`t_due_ns`): the dispatch lag, send
time minus due time, is how far the client fell behind the schedule (docs/METRICS.md); the
summary reports it so that a client too slow for the load says so instead of measuring a gentler
one.

Both stop issuing new requests once `deadline_ns` (monotonic) passes; requests already in flight
finish (bounded by the request timeout), so every issued request is counted.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import aiohttp
import numpy as np

from servelab.bench.client import RawResult
from servelab.bench.workload import RequestSpec

T = TypeVar("T")

Send = Callable[[RequestSpec], Awaitable[RawResult]]
OnDone = Callable[[RawResult], None]


def arrival_offsets_s(n: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """Send times (seconds after the start) of n requests at `rate` req/s: inter-arrival gaps
    drawn from Gamma(shape=burstiness, scale=1/(rate*burstiness)) - mean 1/rate, coefficient of
    variation 1/sqrt(burstiness); burstiness 1 is Poisson (exponential gaps). The first request
    goes at 0; at rate inf every request goes at 0 (all at once).

    Gamma variates scale with their `scale`, so one seed gives the same pattern at every rate,
    stretched by 1/rate: latency differences between the rates of a sweep come from the rate,
    not from a different draw of arrivals."""
    if math.isinf(rate):
        return np.zeros(n)
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    out = np.empty(n)
    if n:
        out[0] = 0.0
        out[1:] = np.cumsum(gaps[:-1])
    return out


def replay_offsets_s(specs: Sequence[RequestSpec]) -> np.ndarray:
    """The due times the specs carry (a trace's clock, already scaled and shifted)."""
    return np.array([s.arrival_s for s in specs], dtype=np.float64)


def largest_burst(offsets_s: np.ndarray, window_s: float = 0.002) -> int:
    """The most requests due within `window_s` of each other (sorted offsets)."""
    a = np.sort(np.asarray(offsets_s, dtype=np.float64))
    if a.size == 0 or not np.isfinite(a).all():
        return int(a.size)
    return int((np.searchsorted(a, a + window_s, side="right") - np.arange(a.size)).max())


async def open_connections(session: aiohttp.ClientSession, url: str, n: int) -> None:
    """Leave `n` idle keep-alive connections in the session's pool (n concurrent GETs of `url`),
    so that a burst of n requests due together does not pay n TCP connects on the event loop
    while it is dispatching them (~80 us each here: 300 connects made the last request of a
    300-burst ~25 ms later; benchmarks/bench_replay_lag.py)."""

    async def one() -> None:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
                await r.read()
        except (TimeoutError, aiohttp.ClientError):
            pass  # an optimisation only: the load runs without it

    await asyncio.gather(*(one() for _ in range(n)))


async def closed_loop(specs: Sequence[RequestSpec], concurrency: int, send: Send,
                      deadline_ns: int | None = None, on_done: OnDone | None = None) -> list[RawResult]:
    """Keep `concurrency` requests in flight until the specs (or the time) run out."""
    results: list[RawResult] = []
    it = iter(specs)

    async def worker() -> None:
        for spec in it:  # one shared iterator: each spec is taken by exactly one worker
            if deadline_ns is not None and time.perf_counter_ns() >= deadline_ns:
                return
            r = await send(spec)
            results.append(r)
            if on_done:
                on_done(r)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, max(len(specs), 1)))))
    return results


async def open_loop(specs: Sequence[RequestSpec], offsets_s: np.ndarray, send: Send,
                    deadline_ns: int | None = None, on_done: OnDone | None = None) -> list[RawResult]:
    """Send spec i at `offsets_s[i]` after the start, whatever is still in flight. Requests due
    at the same time (a trace's burst) are all started before the driver sleeps again."""
    results: list[RawResult] = []
    t0 = time.perf_counter_ns()

    async def one(spec: RequestSpec, due: int) -> None:
        r = await send(spec)
        r.t_due_ns = due
        results.append(r)
        if on_done:
            on_done(r)

    await on_schedule(specs, offsets_s, t0, deadline_ns, one)
    return results


async def on_schedule(items: Sequence[T], offsets_s: Sequence[float] | np.ndarray, t0_ns: int,
                      deadline_ns: int | None, start: Callable[[T, int], Awaitable[None]]) -> None:
    """Start `start(item, due_ns)` as a task at `t0_ns` + each item's offset, whatever is still
    running (items due together are all started before the loop sleeps again; none past the
    deadline), then wait for them all: the open loop's clock, for requests and for sessions."""
    tasks: list[asyncio.Task[None]] = []
    for item, off in zip(items, offsets_s, strict=True):
        due = t0_ns + int(off * 1e9)
        if deadline_ns is not None and due >= deadline_ns:
            break
        delay = (due - time.perf_counter_ns()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(start(item, due)))
    if tasks:
        await asyncio.gather(*tasks)
