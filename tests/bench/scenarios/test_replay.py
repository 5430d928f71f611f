"""Trace replay on the file's clock, judged by the server: a trace with bursts (30 requests in one
millisecond) is replayed against a scripted server in its own process, and the arrivals in the
server's own log are compared with the schedule; the same schedule sent by a minimal asyncio
client (a sleep and a task per request, nothing else) is the reference the replay must match.
Past the client's limit (2000 requests due at once) the summary says it fell behind.

The bounds are generous (a shared 2-core box) but meaningful: the median is the issue's 2 ms,
the p99 may exceed the minimal client's by 50% + 1 ms, no more.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import aiohttp
import numpy as np

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.run import run_load_point
from servelab.bench.scripted.harness import serve_subprocess
from servelab.bench.scripted.script import Script


def bursty_trace(path, bursts: int = 6, burst: int = 20, singles: int = 300) -> list[float]:
    """Mooncake JSONL: `bursts` bursts of `burst` requests in one ms, 300 ms apart, and
    `singles` requests 6 ms apart around them (a third of the requests come in bursts, as in
    Mooncake's toolagent trace, where many requests share a millisecond); the due times (s)."""
    ts = [b * 300.0 for b in range(bursts) for _ in range(burst)]
    ts += [3.0 + 6.0 * i for i in range(singles)]
    ts.sort()
    with open(path, "w") as f:
        for i, t in enumerate(ts):
            f.write(json.dumps({"timestamp": t, "input_length": 8, "output_length": 2,
                                "hash_ids": [i]}) + "\n")
    return [t / 1000 for t in ts]


def server_lags_ms(log: list[dict], due_ns: list[int]) -> list[float]:
    """Arrival at the server minus due time, pairing the i-th arrival with the i-th due time
    (due times sorted; requests due together are interchangeable)."""
    arr = sorted(r["arrival_ns"] for r in log)
    assert len(arr) == len(due_ns), (len(arr), len(due_ns))
    return [(a - d) / 1e6 for a, d in zip(arr, sorted(due_ns), strict=True)]


async def minimal_client(url: str, offsets_s: list[float]) -> list[int]:
    """The reference: sleep until each due time, start a task that posts and reads the stream."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def one(i: int) -> None:
            async with s.post(url + "/v1/completions", json={
                    "prompt": f"w{i} a b c d e f g", "max_tokens": 2, "ignore_eos": True,
                    "stream": True}) as r:
                await r.read()

        t0 = time.perf_counter_ns()
        tasks, due = [], []
        for i, off in enumerate(offsets_s):
            d = t0 + int(off * 1e9)
            delay = (d - time.perf_counter_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            due.append(d)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    return due


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def test_replay_follows_the_trace_clock_as_well_as_a_minimal_client(tmp_path):
    path = tmp_path / "bursts.jsonl"
    offsets = bursty_trace(path)
    wl = WorkloadConfig(dataset_name="trace", dataset=str(path), num_prompts=10_000)
    with serve_subprocess(Script(ttft_ms=5, gap_ms=1)) as h:
        cfg = BenchConfig(base_url=h.url, workload=wl)
        results = []
        for _ in range(3):  # the better of a few rounds each: another process may take the CPU
            h.reset()
            res = run_load_point(cfg, LoadPoint(), progress=False)
            recs = res.records
            assert res.summary["completed"] == len(offsets) and res.summary["load_key"] == "replay"
            due = [r["t_start_ns"] - int(r["dispatch_lag_ms"] * 1e6) for r in recs]
            ours = server_lags_ms(h.log(), due)
            h.reset()
            mdue = asyncio.run(minimal_client(h.url, offsets))
            mini = server_lags_ms(h.log(), mdue)
            burst_ours = [x for x, d in zip(ours, sorted(due), strict=True)
                          if sorted(due).count(d) > 1]
            results.append((statistics.median(ours), pct(ours, 99), statistics.median(mini),
                            pct(mini, 99), res.summary, statistics.median(burst_ours),
                            pct(burst_ours, 99)))
    # the best round of each client: another process on the 2 cores can spoil any one round
    med, p99, _, _, s, bmed, bp99 = min(results, key=lambda x: x[1])
    mmed, mp99 = min(((x[2], x[3]) for x in results), key=lambda t: t[1])
    print(f"\nserver-side lag ms: servelab median {med:.3f} p99 {p99:.3f} (burst requests: median "
          f"{bmed:.3f} p99 {bp99:.3f}) | minimal client median {mmed:.3f} p99 {mp99:.3f} | "
          f"client-side {s['dispatch_lag_ms']} | all rounds (ours med, p99, minimal med, p99) "
          f"{[tuple(round(v, 3) for v in x[:4]) for x in results]}")
    # arrivals follow the schedule as closely as Python on this machine can send them: held
    # against the minimal client of the same rounds, not against absolute milliseconds (a busy
    # 2-core machine moves both; the absolute numbers are benchmarks/bench_replay_lag.py's)
    assert med <= 1.5 * mmed + 1.0, results
    assert p99 <= 1.5 * mp99 + 1.0, results
    assert s["dispatch_behind"] is False and s["trace_format"] == "mooncake"


def test_past_the_clients_limit_the_result_says_it_fell_behind(tmp_path):
    path = tmp_path / "flood.jsonl"
    with open(path, "w") as f:
        for i in range(2000):  # 2000 requests due in the same millisecond
            f.write(json.dumps({"timestamp": 0, "input_length": 4, "output_length": 1,
                                "hash_ids": [i]}) + "\n")
    with serve_subprocess(Script(ttft_ms=1, gap_ms=0, record_log=False)) as h:
        cfg = BenchConfig(base_url=h.url, workload=WorkloadConfig(
            dataset_name="trace", dataset=str(path), num_prompts=2000, output_len=1))
        s = run_load_point(cfg, LoadPoint(), progress=False).summary
    print(f"\nflood: dispatch lag {s['dispatch_lag_ms']}")
    assert s["completed"] == 2000
    assert s["dispatch_behind"] is True and s["dispatch_lag_ms"]["p99"] > 10.0
