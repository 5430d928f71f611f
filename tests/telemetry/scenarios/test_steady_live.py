"""Steadiness on series recorded live: the scripted server as a subprocess
(`python -m servelab.bench.scripted --max-running 1`), one slot serving a request in
ttft 20 ms + 9 gaps of 10 ms = 110 ms, i.e. a capacity of 9.1 req/s by construction. Sent 16
req/s for 5 s the queue must grow throughout (+6.9 req/s in the fluid limit); sent 4 req/s
(44% load) it must be steady. Requests are sent on a fixed grid from a thread pool (open loop:
a send never waits for an answer)."""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from servelab.bench.scripted.harness import serve_subprocess
from servelab.bench.scripted.script import Script
from servelab.telemetry.server import Scraper, ServerSeries
from servelab.telemetry.steady import assess, server_series

SCRIPT = Script(ttft_ms=20, gap_ms=10, max_running=1, record_log=False)
CAPACITY = 1000 / (20 + 9 * 10)  # req/s


def _one(url: str) -> float:
    body = json.dumps({"model": "scripted-model", "prompt": "hi", "max_tokens": 10,
                       "stream": True, "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as f:
        f.read()
    return time.monotonic()


def _drive(rate: float, seconds: float) -> tuple[ServerSeries, float, float]:
    """Send `rate` req/s for `seconds` while scraping every 0.1 s; the series, when the first
    and the last request were sent (seconds on the scraper's clock)."""
    with serve_subprocess(SCRIPT) as srv, ThreadPoolExecutor(256) as pool:
        sc = Scraper(srv.url + "/metrics", interval_s=0.1).start()
        time.sleep(0.3)  # an idle lead before the load
        t0 = time.monotonic()
        futs, n = [], int(rate * seconds)
        for i in range(n):
            time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            futs.append(pool.submit(_one, srv.url))
        last_sent = time.monotonic()
        for f in futs:
            f.result()
        time.sleep(0.3)
        series = sc.stop()
    return series, t0 - sc.t0, last_sent - sc.t0


def test_a_rate_above_capacity_is_flagged_above_saturation():
    assert 16 > 1.5 * CAPACITY
    series, start, end = _drive(16.0, 5.0)
    t, q = series.t_s, series.gauge("queued_requests")
    s = assess({"queue": (t, q)}, load_start_s=start, load_end_s=end)
    assert s.status == "above_saturation", (s.reason, q)
    # the fluid queue grows at 16 - 9.1 = 6.9 req/s; the scrape sees it within 25%
    assert 0.75 * (16 - CAPACITY) < s.trends["queue"].slope < 1.25 * (16 - CAPACITY), s.trends
    assert max(q) >= 25 and q[-1] == 0  # grew to ~34, then drained after the load


def test_a_rate_below_capacity_is_steady():
    series, start, end = _drive(4.0, 5.0)
    inputs, inflight = server_series(series)
    assert set(inputs) == {"queue", "throughput"}  # the scripted server counts its tokens
    s = assess(inputs, load_start_s=start, load_end_s=end)
    assert s.status == "steady", (s.reason, series.gauge("queued_requests"))
    # the throughput (40 tok/s offered) is flat over the steady span
    assert s.trends["throughput"].direction == "flat"
    # without the send times, the drain is found from the in-flight count, after the load
    found = assess(inputs, load_start_s=start, in_flight=inflight).drain_start_s
    assert found is not None and found >= end - 0.5, (found, end)
    assert max(series.gauge("running_requests")) == 1
