"""Accuracy of servelab bench against a scripted server running in a separate process.

Reference: the server's own record of when it sent each chunk (CLOCK_MONOTONIC, shared by both
processes), which sees the same CPU scheduling as the client; plus a coarse check against the
scripted values themselves. Tolerance of the issue: 2% or 0.3 ms, whichever is larger.
"""

from __future__ import annotations

import os
import statistics

import pytest

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.run import run_load_point
from servelab.bench.scripted.harness import serve_subprocess
from servelab.bench.scripted.script import Script

TTFT_MS, GAP_MS = 40.0, 8.0


def tol(ref: float) -> float:
    return max(0.02 * abs(ref), 0.3)


def server_truth(rec: dict, srv: dict) -> dict:
    """What the client should have measured, from the server's send times."""
    send = srv["send_ns"]
    k = srv["chunk_tokens"]
    n = sum(k)
    ttft = (send[0] - rec["t_start_ns"]) / 1e6
    e2e_end = srv["done_ns"]
    itl = []
    for i in range(1, len(send)):
        g = (send[i] - send[i - 1]) / 1e6
        itl += [g / k[i]] * k[i]
    return {"ttft": ttft, "tpot": (e2e_end - send[0]) / 1e6 / (n - 1), "itl": itl, "n": n}


@pytest.fixture(scope="module", params=[1, 4], ids=["1tok-chunks", "4tok-chunks"])
def server(request):
    k = request.param
    with serve_subprocess(Script(ttft_ms=TTFT_MS, gap_ms=GAP_MS, tokens_per_chunk=k)) as h:
        yield h, k


ATTEMPTS = 6  # a timing miss is retried: on a shared 2-core box another process can take the
# CPU from the client for a few ms; the exact checks hold on every attempt.


def check_timing(h, k: int, concurrency: int, num: int, seed: int,
                 api: str = "completions") -> list[str]:
    """One load point; asserts what must hold exactly, returns timing misses (empty: all good)."""
    out_len = 1 + 4 * k  # (n - 1) % k == 0: every verify chunk is full, true tau == k
    cfg = BenchConfig(base_url=h.url, api=api, workload=WorkloadConfig(
        input_len=16, output_len=out_len, num_prompts=num, seed=seed))
    h.reset()
    res = run_load_point(cfg, LoadPoint(concurrency=concurrency), progress=False)
    s = res.summary
    assert s["completed"] == num and s["failed"] == 0, s["failure_reasons"]
    log = {r["id"]: r for r in h.log()}
    truths = []
    for rec in res.records:
        t = server_truth(rec, log[rec["response_id"]])
        assert rec["output_tokens"] == t["n"] == out_len
        assert rec["chunk_tokens"] == log[rec["response_id"]]["chunk_tokens"]
        truths.append(t)
    # the client-side acceptance estimate is exactly the tokens per verify chunk
    assert s["accept_length_by_source"]["estimate:tokens_per_chunk"] == pytest.approx(k, abs=1e-12)
    assert s["output_throughput_tok_s"] == pytest.approx(num * out_len / s["duration_s"])
    assert s["ttft_ms"]["mean"] == pytest.approx(statistics.fmean(r["ttft_ms"] for r in res.records))
    misses = []
    # coarse check against the script itself: a starved server process misses its own schedule
    # (late first chunk, then a burst to catch up), which is a retry, not a client error.
    # Connection set-up of 64 new streams delays arrival, so TTFT is taken from arrival here.
    since_arrival = [r["ttft_ms"] - (log[r["response_id"]]["arrival_ns"] - r["t_start_ns"]) / 1e6
                     for r in res.records]
    coarse = {"ttft from arrival": (statistics.median(since_arrival), TTFT_MS, TTFT_MS + 25),
              "tpot mean": (s["tpot_ms"]["mean"], GAP_MS / k * 0.75, GAP_MS / k * 1.5),
              "chunk gap mean": (s["chunk_gap_ms"]["mean"], GAP_MS * 0.75, GAP_MS * 1.5)}
    for name, (v, lo, hi) in coarse.items():
        if not lo <= v <= hi:
            misses.append(f"server off its script: {name} {v:.2f} ms not in [{lo:.2f}, {hi:.2f}]")

    # The reported statistics (mean over requests / tokens) must be within tolerance of the
    # same statistics of the server's send times. The typical per-request / per-token error
    # (median |err|) too, except at c=64: there 64 streams tick at once and each side handles
    # its 64 sockets one after the other (~1 ms per batch on this box), so single gaps jitter
    # by the order, while the means are unaffected: allowed 4x the tolerance there.
    per_item = 4.0 if concurrency >= 32 else 1.0
    c_itl = [x for r in res.records for x in r["itl_ms"]]
    s_itl = [x for t in truths for x in t["itl"]]
    assert len(c_itl) == len(s_itl) == num * (out_len - 1)
    pairs = {
        "ttft_ms": ([r["ttft_ms"] for r in res.records], [t["ttft"] for t in truths]),
        "tpot_ms": ([r["tpot_ms"] for r in res.records], [t["tpot"] for t in truths]),
        "itl_ms": (c_itl, s_itl),
    }
    for key, (cv, sv) in pairs.items():
        d = [c - t for c, t in zip(cv, sv, strict=True)]
        t_mean = tol(statistics.fmean(sv))
        med = statistics.median(abs(x) for x in d)
        if abs(statistics.fmean(d)) > t_mean or med > per_item * tol(statistics.median(sv)):
            misses.append(f"{key}: mean err {statistics.fmean(d):.3f} ms (tolerance "
                          f"{t_mean:.3f}), median |err| {med:.3f} ms")
        # the reported median (what a user reads; the mean is the check above) against the
        # truth's median, with the same allowance for the order jitter of 64 streams
        ref = statistics.median(sv)
        if abs(s[key]["median"] - ref) > per_item * tol(ref):
            misses.append(f"{key} reported median {s[key]['median']:.3f} ms, truth {ref:.3f} ms")
    return misses


def give_up(misses: list[list[str]]) -> None:
    """Every attempt missed. On an oversubscribed machine (more than two runnable processes
    per CPU on average) a process is routinely off-CPU for several ms, which no user-space client
    can time around: the conditions for a 0.3 ms check do not exist, so skip with the evidence.
    Otherwise it is a failure."""
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    msg = (f"timing outside 2% / 0.3 ms in all {ATTEMPTS} attempts (load average {load:.1f} on "
           f"{cpus} CPUs): {misses}")
    if load > 2 * cpus:
        pytest.skip("machine oversubscribed; " + msg)
    pytest.fail(msg)


@pytest.mark.parametrize("concurrency,num", [(1, 4), (8, 16), (64, 64)])
def test_latency_matches_server_send_times(server, concurrency, num):
    h, k = server
    misses = []
    for attempt in range(ATTEMPTS):
        m = check_timing(h, k, concurrency, num, seed=attempt)
        if not m:
            return
        misses.append(m)
    give_up(misses)


@pytest.mark.parametrize("api", ["chat", "sglang"])
def test_other_apis_match_server_send_times(server, api):
    """Chat (its role-only first chunk is not a token) and SGLang /generate (cumulative text,
    token counts per chunk from meta_info) give the same timings."""
    h, k = server
    misses = []
    for attempt in range(ATTEMPTS):
        m = check_timing(h, k, 8, 16, seed=attempt, api=api)
        if not m:
            return
        misses.append(m)
    give_up(misses)


def test_open_loop_accuracy_and_schedule(server):
    """Open loop at 40 req/s: latencies still match, and requests leave on the seeded schedule."""
    from servelab.bench.load import arrival_offsets_s

    h, k = server
    cfg = BenchConfig(base_url=h.url, workload=WorkloadConfig(input_len=8, output_len=1 + 2 * k,
                                                              num_prompts=24, seed=5))
    res = run_load_point(cfg, LoadPoint(request_rate=40.0), progress=False)
    assert res.summary["completed"] == 24
    log = {r["id"]: r for r in h.log()}
    d = [r["ttft_ms"] - server_truth(r, log[r["response_id"]])["ttft"] for r in res.records]
    assert statistics.median(abs(x) for x in d) <= tol(TTFT_MS), d
    offs = arrival_offsets_s(24, 40.0, 1.0, 5)
    starts = sorted(r["start_s"] for r in res.records)
    lag_ms = [(st - (o - offs[0])) * 1e3 for st, o in zip(starts, offs, strict=True)]
    assert statistics.median(lag_ms) < 15, lag_ms  # sent on schedule, not after earlier answers
