"""The scraper on the embedded engine (`servelab serve --config tiny --device cpu`, one slot):
8 requests sent at once make its queue rise to 7 and drain to 0, and its token counter
advances by exactly what was generated; its KV-cache usage is 0 when idle and above 0 under
the load."""

from __future__ import annotations

import threading
import time

import pytest
from http_call import sse
from serve_proc import one_slot_tiny

from servelab.telemetry.server import Scraper
from servelab.telemetry.steady import assess, drain_start

N, TOKENS = 8, 16


@pytest.fixture(scope="module")
def server():
    yield from one_slot_tiny()


def _one(url: str) -> None:
    sse(url, "/v1/completions", {"model": "tiny", "prompt": "def f(x):\n    return",
                                 "max_tokens": TOKENS, "ignore_eos": True, "stream": True})


def test_the_queue_rises_and_drains_with_the_load(server):
    with Scraper(server + "/metrics", interval_s=0.05) as sc:
        time.sleep(0.2)
        threads = [threading.Thread(target=_one, args=(server,)) for _ in range(N)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        time.sleep(0.2)
    s = sc.series
    q, run = s.gauge("queued_requests"), s.gauge("running_requests")
    assert all(e is None for e in s.errors), s.errors[:3]
    assert q[0] == 0 and q[-1] == 0 and run[-1] == 0, (q, run)
    assert max(q) >= N - 2, q  # all but the running one queued (a scrape may miss the peak)
    assert max(run) == 1
    peak = q.index(max(q))
    assert all(q[i] >= q[i + 1] for i in range(peak, len(q) - 1)), f"not draining: {q}"
    gen = s.gauge("generation_tokens")
    assert gen[-1] - gen[0] == N * TOKENS
    assert s.sources["queued_requests"] == "sglang:num_queue_reqs"
    # one slot running a request at a time: its rows over the cache's, 0 when idle
    kv = s.gauge("kv_cache_usage")
    assert kv[0] == 0 and kv[-1] == 0 and 0 < max(kv) < 1, kv
    assert s.sources["kv_cache_usage"] == "sglang:token_usage"
    inflight = [a + b for a, b in zip(q, run, strict=True)]
    assert drain_start(s.t_s, inflight) is not None


def test_a_rate_three_times_its_capacity_is_above_saturation(server):
    """One slot serves a request in S seconds (measured here, alone): capacity 1/S. Sent 3/S
    req/s for 120 requests the queue grows at ~2/S req/s for the whole load. (With 40 the load
    lasted ~13 S: on a busy CI machine its second half held fewer scrapes than a trend test
    takes, and the verdict fell to `unsteady`.)"""
    t = time.monotonic()
    for _ in range(3):
        _one(server)
    service = (time.monotonic() - t) / 3
    rate, n = 3.0 / service, 120
    with Scraper(server + "/metrics", interval_s=max(0.02, service / 4)) as sc:
        t0 = time.monotonic()
        threads = []
        for i in range(n):
            time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            th = threading.Thread(target=_one, args=(server,))
            th.start()
            threads.append(th)
        end = time.monotonic() - sc.t0
        for th in threads:
            th.join()
    s = sc.series
    v = assess({"queue": (s.t_s, s.gauge("queued_requests"))}, load_start_s=t0 - sc.t0,
               load_end_s=end)
    assert v.status == "above_saturation", (v.reason, s.gauge("queued_requests"))
    assert v.trends["queue"].slope > 0.5 * 2 / service, (v.trends, service)
