"""A load point against the embedded engine (`servelab serve --config tiny --device cpu`, one
slot), stored: its telemetry side file shows the queue rising with the load and draining to 0
after it, and its token counter advancing by what the client received."""

from __future__ import annotations

import math

import pytest
from serve_proc import one_slot_tiny

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.run import run_load_point, save_load_point
from servelab.store import Store

N, TOKENS = 8, 16


@pytest.fixture(scope="module")
def server():
    yield from one_slot_tiny()


def test_the_stored_series_shows_the_queue_rise_and_drain(server, tmp_path):
    cfg = BenchConfig(base_url=server, workload=WorkloadConfig(num_prompts=N, input_len=8,
                                                               output_len=TOKENS),
                      scrape_interval_s=0.05)
    load = LoadPoint(request_rate=math.inf)  # all 8 at once into one slot: 7 wait
    res = run_load_point(cfg, load, progress=False)
    assert res.summary["completed"] == N
    with Store(tmp_path / "r.db") as st:
        row = st.load_point(save_load_point(st, cfg, load, res))
        series = st.telemetry(row)
    srv = series["server"]
    q, t = srv["series"]["queued_requests"], srv["t_s"]
    peak = q.index(max(q))
    assert max(q) >= N - 3, q  # the scrape catches most of the 7 waiting
    assert t[peak] >= series["load_start_s"] and q[-1] == 0  # rose with the load, drained
    assert all(b <= a for a, b in zip(q[peak:], q[peak + 1:], strict=False)), q  # no refill
    gen = [x for x in srv["series"]["generation_tokens"] if x is not None]
    assert gen[-1] - gen[0] == res.summary["total_output_tokens"] == N * TOKENS
    assert res.summary["max_queued_requests"] == max(q)
    assert res.summary["steadiness"]["status"] == "too_short"  # sent at once: no time axis
