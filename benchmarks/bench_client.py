"""Client overhead of `servelab bench`: the streamed tokens/s one client core absorbs, and how much
the client inflates TPOT, against the scripted server on loopback (a separate process).

Modes:
- burst: zero-delay server (each chunk its own write, no pause between them, as fast as the
  server process can): tok/s per client CPU-second is the client's ceiling.
- paced: the server sends one token every --gap-ms per stream; inflation = client TPOT minus the
  TPOT in the server's own send times (same monotonic clock), per request.

Run:  .venv/bin/python benchmarks/bench_client.py [--concurrency 256] [--output-len 256]
      [--num-prompts 1024] [--mode burst,paced] [--gap-ms 20] [--pin] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.run import run_load_point
from servelab.bench.scripted.harness import serve_subprocess
from servelab.bench.scripted.script import Script


def one(mode: str, a: argparse.Namespace) -> dict:
    gap = 0.0 if mode == "burst" else a.gap_ms
    script = Script(ttft_ms=0.0 if mode == "burst" else a.gap_ms, gap_ms=gap, tokenize=False,
                    metrics=False)
    with serve_subprocess(script) as h:
        if a.pin and hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > 1:
            os.sched_setaffinity(0, {0})  # the client on core 0 (the server keeps the others)
        wl = WorkloadConfig(input_len=8, output_len=a.output_len, num_prompts=a.num_prompts)
        cfg = BenchConfig(base_url=h.url, workload=wl, warmup=min(a.concurrency, a.num_prompts))
        prof = cProfile.Profile() if a.profile else None
        if prof:
            prof.enable()
        res = run_load_point(cfg, LoadPoint(concurrency=a.concurrency), progress=False)
        if prof:
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
            print(f"--- profile ({mode}) ---\n{buf.getvalue()}")
        s = res.summary
        # inflation: client TPOT minus the TPOT of the server's own send times, per request
        log = {r["id"]: r for r in h.log()}
        d = []
        for r in res.records:
            sv = log.get(r["response_id"])
            if r["ok"] and sv and r["output_tokens"] > 1:
                true_tpot = (sv["done_ns"] - sv["send_ns"][0]) / 1e6 / (r["output_tokens"] - 1)
                d.append(r["tpot_ms"] - true_tpot)
        inflation = statistics.fmean(d) if d else None
    tokens = s["total_output_tokens"] or 0
    return {"mode": mode, "c": a.concurrency, "done": s["completed"], "failed": s["failed"],
            "tokens": tokens, "wall_s": s["duration_s"], "cpu_s": s["client_cpu_s"],
            "tok_s_wall": tokens / s["duration_s"] if s["duration_s"] else None,
            "tok_s_per_cpu": tokens / s["client_cpu_s"] if s["client_cpu_s"] else None,
            "tpot_ms": s["tpot_ms"]["mean"], "inflation_ms": inflation}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--num-prompts", type=int, default=1024)
    p.add_argument("--mode", default="burst,paced")
    p.add_argument("--gap-ms", type=float, default=20.0)
    p.add_argument("--pin", action="store_true", help="pin the client to core 0")
    p.add_argument("--profile", action="store_true", help="cProfile the client (slows it)")
    a = p.parse_args()
    rows = [one(m, a) for m in a.mode.split(",")]
    hdr = ("mode", "c", "done", "failed", "tokens", "wall_s", "cpu_s", "tok_s_wall", "tok_s_per_cpu",
           "tpot_ms", "inflation_ms")
    print(f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, cpus {os.cpu_count()}, "
          f"load avg {os.getloadavg()[0]:.2f}")
    print(" | ".join(hdr))
    for r in rows:
        print(" | ".join(f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for k in hdr))


if __name__ == "__main__":
    main()
