"""How closely `servelab bench` keeps a replayed trace's clock, judged by the server: bursts of
B requests due in the same millisecond, every --period-ms, replayed against the scripted server
in its own process; the arrival times in the server's log minus the due times give the lag of
each request as the server saw it. The same schedule sent by a minimal asyncio client (a sleep
and a task per request, nothing else) is the reference: what Python on this machine can do.

Run:  .venv/bin/python benchmarks/bench_replay_lag.py [--bursts 1,10,30,100,300] [--rounds 6]
      [--period-ms 200]

Prints one row per burst size: server-side lag median / p99 / max (ms) for servelab and the
minimal client, servelab's own dispatch_lag_ms p99 and whether it flagged itself behind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.run import run_load_point
from servelab.bench.scripted.harness import Handle, serve_subprocess
from servelab.bench.scripted.script import Script


def lags(h: Handle, due_ns: list[int]) -> np.ndarray:
    arr = sorted(r["arrival_ns"] for r in h.log())
    return (np.asarray(arr) - np.asarray(sorted(due_ns))) / 1e6


async def minimal(url: str, offsets: list[float]) -> list[int]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def one(i: int) -> None:
            async with s.post(url + "/v1/completions", json={
                    "prompt": f"w{i} a b c", "max_tokens": 2, "ignore_eos": True,
                    "stream": True}) as r:
                await r.read()

        t0 = time.perf_counter_ns()
        tasks, due = [], []
        for i, off in enumerate(offsets):
            d = t0 + int(off * 1e9)
            delay = (d - time.perf_counter_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            due.append(d)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    return due


def row(h: Handle, burst: int, rounds: int, period_ms: float, tmp: Path) -> dict:
    offsets = [r * period_ms / 1000 for r in range(rounds) for _ in range(burst)]
    path = tmp / f"b{burst}.jsonl"
    path.write_text("".join(json.dumps({"timestamp": o * 1000, "input_length": 4,
                                        "output_length": 2, "hash_ids": [i]}) + "\n"
                            for i, o in enumerate(offsets)))
    cfg = BenchConfig(base_url=h.url, workload=WorkloadConfig(
        dataset_name="trace", dataset=str(path), num_prompts=len(offsets)))
    h.reset()
    res = run_load_point(cfg, LoadPoint(), progress=False)
    due = [r["t_start_ns"] - int(r["dispatch_lag_ms"] * 1e6) for r in res.records]
    ours = lags(h, due)
    h.reset()
    ref = lags(h, asyncio.run(minimal(h.url, offsets)))
    s = res.summary
    return {"burst": burst, "ours": ours, "ref": ref, "client_p99": s["dispatch_lag_ms"]["p99"],
            "behind": s["dispatch_behind"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bursts", default="1,10,30,100,300")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--period-ms", type=float, default=200.0)
    a = ap.parse_args()
    print(f"{'burst':>6} | {'servelab med':>12} {'p99':>7} {'max':>7} | {'minimal med':>11} "
          f"{'p99':>7} {'max':>7} | {'client p99':>10} behind")
    with serve_subprocess(Script(ttft_ms=5, gap_ms=1)) as h, tempfile.TemporaryDirectory() as d:
        for b in (int(x) for x in a.bursts.split(",")):
            r = row(h, b, a.rounds, a.period_ms, Path(d))
            o, m = r["ours"], r["ref"]
            print(f"{b:>6} | {np.median(o):12.2f} {np.percentile(o, 99):7.2f} {o.max():7.2f} | "
                  f"{np.median(m):11.2f} {np.percentile(m, 99):7.2f} {m.max():7.2f} | "
                  f"{r['client_p99']:10.2f} {r['behind']}")


if __name__ == "__main__":
    main()
