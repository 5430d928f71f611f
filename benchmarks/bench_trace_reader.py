"""Trace reader: parse speed and peak memory, streaming (ijson) vs whole-file (orjson).

Synthetic Kineto traces (servelab.profile.synth) with a FIXED number of GPU kernels and a growing
number of CPU-op events per kernel, as real traces grow with host-side detail. If the streaming
reader is memory bounded, its peak RSS stays flat while the file grows; orjson's grows with it.
Each measurement runs in a fresh Python process (peak RSS is per process).

    python benchmarks/bench_trace_reader.py [--kernels 20000] [--noise 0,10,40] [--dir /tmp/x]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
from servelab.profile.trace import read_trace
from servelab.profile.steps import find_steps
path, mode = sys.argv[1], sys.argv[2]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
t = read_trace(path, streaming=(mode == "stream"))
dt = time.perf_counter() - t0
n_steps = len(find_steps(t).steps)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"s": dt, "events": t.n_events, "gpu": t.n_gpu, "steps": n_steps,
                  "rss_base_mb": base / 1024, "rss_peak_mb": peak / 1024}))
"""


def make(path: Path, kernels: int, noise: int, per_step: int = 200) -> None:
    from servelab.profile.synth import SynthKernel, write_trace

    names = ["nvjet_sm90_gemm", "flash_fwd_splitkv_kernel", "rms_norm_kernel", "fused_moe_kernel"]
    steps = ([SynthKernel(names[k % 4], 3.0) for k in range(per_step)]
             for _ in range(kernels // per_step))
    write_trace(path, steps, cpu_noise=noise)


def measure(path: Path, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", type=int, default=20000)
    ap.add_argument("--noise", default="0,10,40", help="CPU-op events per kernel, comma separated")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="trace-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for noise in [int(x) for x in args.noise.split(",")]:
        path = work / f"synth_k{args.kernels}_n{noise}.json"
        t0 = time.perf_counter()
        make(path, args.kernels, noise)
        gen_s = time.perf_counter() - t0
        mb = path.stat().st_size / 1e6
        for mode in ("stream", "orjson"):
            r = measure(path, mode)
            rows.append((noise, mb, mode, r, gen_s))
        path.unlink()
    print(f"{'cpu ops/kernel':>14} {'file MB':>8} {'reader':>7} {'events':>9} {'kernels':>8} "
          f"{'parse s':>8} {'MB/s':>7} {'peak RSS MB':>12} {'over import MB':>15}")
    for noise, mb, mode, r, _ in rows:
        print(f"{noise:>14} {mb:>8.1f} {mode:>7} {r['events']:>9} {r['gpu']:>8} {r['s']:>8.2f} "
              f"{mb / r['s']:>7.1f} {r['rss_peak_mb']:>12.1f} {r['rss_peak_mb'] - r['rss_base_mb']:>15.1f}")


if __name__ == "__main__":
    main()
