"""The scripted server's latency-vs-load law (bench/scripted/script.py), and `servelab bench
--sweep` against it: the true SLO capacity comes from an independent discrete-event simulation
of the documented law on the same arrival times, and the sweep's bracket must hold it."""

from __future__ import annotations

import heapq
import json
import math
import os
import sys
from collections import deque

import numpy as np
import pytest

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.load import arrival_offsets_s
from servelab.bench.run import run_load_point
from servelab.bench.scripted.harness import serve_subprocess
from servelab.bench.scripted.script import Script
from servelab.store import Store


def simulate_law(arrivals_ms: np.ndarray, n_out: int, s: Script) -> tuple[np.ndarray, np.ndarray]:
    """The law as the docstring states it, as a discrete-event simulation: FIFO slots, the first
    token ttft after admission, each later one a step of gap + k (b - 1) after the previous, b
    the requests in slots when the step starts; a slot is freed by the last token. Returns each
    request's (TTFT, TPOT) in ms."""
    events: list[tuple[float, int, int, int]] = []  # (time, seq, request, chunk); chunk -1: arrival
    seq = 0

    def push(t: float, rid: int, chunk: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, rid, chunk))
        seq += 1

    for rid, t in enumerate(arrivals_ms):
        push(float(t), rid, -1)
    busy, queue = 0, deque()
    first, last = {}, {}
    cap = s.max_running if s.max_running is not None else math.inf
    while events:
        t, _, rid, chunk = heapq.heappop(events)
        if chunk == -1:
            if busy < cap:
                busy += 1
                push(t + s.ttft_ms, rid, 0)
            else:
                queue.append(rid)
            continue
        if chunk == 0:
            first[rid] = t
        if chunk == n_out - 1:
            last[rid] = t
            if queue:  # the slot passes to the longest waiter
                push(t + s.ttft_ms, queue.popleft(), 0)
            else:
                busy -= 1
        else:
            push(t + s.gap_ms + s.gap_per_running_ms * max(busy - 1, 0), rid, chunk + 1)
    ids = range(len(arrivals_ms))
    ttft = np.array([first[r] - arrivals_ms[r] for r in ids])
    tpot = np.array([(last[r] - first[r]) / (n_out - 1) for r in ids])
    return ttft, tpot


def timing_miss(msg: str) -> None:
    """A timing check missed. On an oversubscribed machine (load average above 2 per CPU) the
    server process is routinely off-CPU for several ms, so its steps run late and the law is
    not what it served: skip with the evidence. Otherwise it is a failure."""
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load > 2 * cpus:
        pytest.skip(f"machine oversubscribed (load average {load:.1f} on {cpus} CPUs): {msg}")
    pytest.fail(msg)


def test_simulation_matches_the_law_by_hand():
    s = Script(ttft_ms=20, gap_ms=10, max_running=2, gap_per_running_ms=5)
    # three at once with two slots: two share the batch (step 15 ms), the third waits for a slot
    ttft, tpot = simulate_law(np.zeros(3), 5, s)
    assert list(ttft) == [20.0, 20.0, 20.0 + 4 * 15.0 + 20.0]
    assert list(tpot) == [15.0, 15.0, 10.0]


def test_closed_loop_tpot_follows_the_batch_slowdown():
    s = Script(ttft_ms=20, gap_ms=10, gap_per_running_ms=5, max_running=8)
    with serve_subprocess(s) as h:
        cfg = BenchConfig(base_url=h.url, workload=WorkloadConfig(input_len=4, output_len=9,
                                                                  num_prompts=12))
        tpot = {c: run_load_point(cfg, LoadPoint(concurrency=c), progress=False).summary["tpot_ms"]
                for c in (1, 4)}
    # every request of a wave is in a slot for all its steps: TPOT = gap + k (b - 1)
    if abs(tpot[1]["median"] - 10.0) > 1.0 or abs(tpot[4]["median"] - 25.0) > 1.5:
        timing_miss(f"TPOT medians {tpot[1]['median']:.2f} (c=1, law 10) and "
                    f"{tpot[4]['median']:.2f} ms (c=4, law 25)")


def test_slots_queue_first_in_first_out():
    s = Script(ttft_ms=20, gap_ms=10, max_running=2)  # 5 tokens: a slot is held 20 + 4 x 10 ms
    with serve_subprocess(s) as h:
        cfg = BenchConfig(base_url=h.url, workload=WorkloadConfig(input_len=4, output_len=5,
                                                                  num_prompts=6))
        res = run_load_point(cfg, LoadPoint(request_rate=math.inf), progress=False)
        log = sorted(h.log(), key=lambda r: r["arrival_ns"])
    waits = [(r["admit_ns"] - r["arrival_ns"]) / 1e6 for r in log]
    # two at once, two a slot time later, two after that (arrivals a few ms apart)
    assert waits[0] < 5 and waits[1] < 5
    for i, want in ((2, 60.0), (3, 60.0), (4, 120.0), (5, 120.0)):
        assert waits[i] == pytest.approx(want, abs=15.0), waits
    admits = [r["admit_ns"] for r in log]
    assert admits == sorted(admits)  # first come, first served
    ttft = sorted(r["ttft_ms"] for r in res.records)
    assert ttft[-1] == pytest.approx(20.0 + 120.0, abs=20.0)


def reference_capacity(slo_tpot_ms: float, slo_ttft_ms: float, n_req: int, n_out: int,
                       s: Script, seed: int, burstiness: float, hi: float) -> float:
    """The largest rate (step 0.02 req/s) below which every rate meets both p99 SLOs in the
    simulation, on the arrival times the client draws for that rate."""
    lam = 0.5
    while lam < hi:
        arr = arrival_offsets_s(n_req, lam, burstiness, seed) * 1e3
        ttft, tpot = simulate_law(arr, n_out, s)
        if np.percentile(tpot, 99) > slo_tpot_ms or np.percentile(ttft, 99) > slo_ttft_ms:
            return lam - 0.02
        lam += 0.02
    return hi


def test_sweep_brackets_the_true_capacity(monkeypatch, capsys, tmp_path):
    # 16 slots, steps of 10 ms + 4 ms per other request in a slot: TPOT rises smoothly with load
    # and crosses 40 ms below the saturated rate (~27 req/s)
    s = Script(ttft_ms=20, gap_ms=10, gap_per_running_ms=4, max_running=16, record_log=False)
    n_req, n_out, seed, precision = 40, 9, 3, 0.05
    out = tmp_path / "sweep.json"
    db = tmp_path / "r.db"
    from servelab.cli import main

    with serve_subprocess(s) as h:
        monkeypatch.setattr(sys, "argv", [
            "servelab", "bench", "--base-url", h.url, "--sweep", "--slo",
            "ttft_p99_ms=100,tpot_p99_ms=40", "--sweep-precision", str(precision),
            "--num-prompts", str(n_req), "--random-input-len", "4", "--random-output-len",
            str(n_out), "--seed", str(seed), "--quiet", "--output-file", str(out),
            "--store", str(db)])
        with pytest.raises(SystemExit) as ei:
            main()
    text = capsys.readouterr().out
    assert ei.value.code == 0, text
    doc = json.loads(out.read_text())
    cap = doc["sweep"]["capacity"]
    assert cap["status"] == "bracketed", text
    assert cap["width"] <= precision
    # the truth, with the client's timing noise as a tolerance of 2 ms on the TPOT limit
    lo_truth = reference_capacity(38.0, 100.0, n_req, n_out, s, seed, 1.0, 60.0)
    hi_truth = reference_capacity(42.0, 100.0, n_req, n_out, s, seed, 1.0, 60.0)
    if not (cap["low_req_s"] <= hi_truth and cap["high_req_s"] >= lo_truth):
        timing_miss(f"bracket {cap} misses the law's capacity [{lo_truth:.2f}, {hi_truth:.2f}]")
    assert "capacity: " in text and " req/s (bracket width" in text
    # every point is an ordinary stored load point, linked by the sweep id
    with Store(db) as st:
        rows = st.load_points()
    assert len(rows) == len(doc["load_points"]) == len(doc["sweep"]["points"]) <= 12
    assert {r.label for r in rows} == {doc["sweep"]["id"]}
    roles = [r.summary["sweep"]["role"] for r in sorted(rows, key=lambda r: r.id)]
    assert roles[:2] == ["synchronous", "throughput"] and set(roles[2:]) <= {"grid", "refine"}
    keys = {r.load_key for r in rows}
    assert "c=1" in keys and "rate=inf" in keys
    assert f"rate={cap['low_req_s']:g}" in keys and f"rate={cap['high_req_s']:g}" in keys
    assert all(r.summary["goodput_slo"] == {"ttft_ms": 100.0, "tpot_ms": 40.0} for r in rows)


# issue 36's server: the first token 40 ms after arrival, then steps of 1 ms + 1 ms per other
# request in flight, no slot limit, 32 output tokens. In the fluid limit b requests in flight
# give TPOT = b ms and b = rate x (40 + 31 b) ms, so TPOT reaches 40 ms at 31.25 req/s; short
# of it the queue takes tens of seconds to settle, so a point of 100 requests reads its
# median TPOT in the warm-up (about 11 ms at 31 req/s, where the steady state reads 40).
ISSUE36 = Script(ttft_ms=40, gap_ms=1, gap_per_running_ms=1, record_log=False)


def steady_median_tpot(rate: float, seconds: float = 200.0) -> float:
    """The law's median TPOT at `rate` in its steady state: Poisson arrivals for `seconds`,
    the requests that arrive in the second half (past the warm-up), by simulation."""
    arr = arrival_offsets_s(int(rate * seconds), rate, 1.0, 0) * 1e3
    _, tpot = simulate_law(arr, 32, ISSUE36)
    return float(np.median(tpot[arr > seconds * 500.0]))


def test_the_sweeps_defaults_bracket_the_steady_capacity_of_issue_36(monkeypatch, capsys,
                                                                     tmp_path):
    # the sweep's defaults (100 prompts a point, 3 grid rates, precision 10%, 1-s scrapes):
    # without telemetry every rate "met" (>= 31.4, an open bracket); a point whose queue rose
    # all along now misses, and the bracket holds the steady-state capacity
    out = tmp_path / "sweep.json"
    from servelab.cli import main

    with serve_subprocess(ISSUE36) as h:
        monkeypatch.setattr(sys, "argv", [
            "servelab", "bench", "--base-url", h.url, "--sweep", "--slo", "tpot_p50_ms=40",
            "--random-output-len", "32", "--quiet", "--output-file", str(out),
            "--store", str(tmp_path / "r.db")])
        with pytest.raises(SystemExit) as ei:
            main()
    text = capsys.readouterr().out
    assert ei.value.code == 0, text
    cap = json.loads(out.read_text())["sweep"]["capacity"]
    assert cap["status"] == "bracketed", text
    lo, hi = cap["low_req_s"], cap["high_req_s"]
    # the truth, independently: the law's steady median TPOT meets 40 ms at low, misses at high
    if not (steady_median_tpot(lo) <= 40.0 < steady_median_tpot(hi)):
        timing_miss(f"bracket [{lo}, {hi}] misses the steady capacity (~31.0 req/s): median "
                    f"TPOT {steady_median_tpot(lo):.1f} / {steady_median_tpot(hi):.1f} ms")
    flat = " ".join(text.split())  # the console wraps long lines
    assert "rose all along" in flat or "above saturation" in flat  # the miss names its reason
