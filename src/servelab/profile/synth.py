"""Synthetic Kineto traces with known answers (tests) and of any size (reader benchmark).

The layout mimics torch.profiler's: per step a `ProfilerStep#N` user annotation on the host, a
`cudaLaunchKernel` per kernel (correlation id) with CPU-op noise around it, and the kernel on
the GPU timeline. Kernels of one step run back to back from `gpu_offset_us` after the step's host
start, unless a step gives explicit (start, dur) times. Written event by event, so a multi-GB
trace needs no memory.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class SynthKernel:
    """A kernel: name, duration, and (optionally) its start relative to the step and stream."""

    name: str
    dur_us: float
    start_us: float | None = None  # relative to the step's host start; None: after the previous
    stream: int = 7


def write_trace(
    path: str | Path,
    steps: Iterable[list[SynthKernel]],
    step_wall_us: float | None = None,
    gpu_offset_us: float = 5.0,
    cpu_noise: int = 0,
    step_name: str = "ProfilerStep#{i}",
    graph: bool = False,
) -> None:
    """Write a trace whose steps hold these kernels.

    `step_wall_us`: host length of each step (default: just past its last kernel). `cpu_noise`:
    extra cpu_op events per kernel (file size without GPU work, as in real traces). `graph`: all
    kernels of a step share one `cudaGraphLaunch` correlation id.
    """
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "wt") as f:
        f.write('{"schemaVersion": 1, "traceEvents": [\n')
        first = True
        t0 = 1_000_000.0
        corr = 100
        for i, kernels in enumerate(steps):
            events = []
            cursor = gpu_offset_us
            end_rel = 0.0
            if graph:
                corr += 1
                events.append(_rt("cudaGraphLaunch", t0 + 1.0, corr))
            for k, kern in enumerate(kernels):
                start = kern.start_us if kern.start_us is not None else cursor
                cursor = start + kern.dur_us
                end_rel = max(end_rel, cursor)
                if not graph:
                    corr += 1
                    events.append(_rt("cudaLaunchKernel", t0 + 0.5 + 0.01 * k, corr))
                events.append({
                    "ph": "X", "cat": "kernel", "name": kern.name, "pid": 0, "tid": kern.stream,
                    "ts": t0 + start, "dur": kern.dur_us,
                    "args": {"device": 0, "stream": kern.stream, "correlation": corr,
                             "grid": [1, 1, 1], "block": [128, 1, 1]},
                })
                for n in range(cpu_noise):
                    events.append({
                        "ph": "X", "cat": "cpu_op", "name": f"aten::op_{n}", "pid": 1, "tid": 1,
                        "ts": t0 + 0.1 * n, "dur": 0.05,
                        "args": {"External id": corr * 10 + n, "Input Dims": [[32, 4096], [4096]],
                                 "Input type": ["c10::BFloat16", "float"]},
                    })
            wall = step_wall_us if step_wall_us is not None else end_rel + 1.0
            events.insert(0, {"ph": "X", "cat": "user_annotation", "name": step_name.format(i=i),
                              "pid": 1, "tid": 1, "ts": t0, "dur": wall})
            for ev in events:
                if not first:
                    f.write(",\n")
                f.write(json.dumps(ev))
                first = False
            t0 += max(wall, end_rel) + 1.0
        f.write('\n], "displayTimeUnit": "ms"}\n')


def _rt(name: str, ts: float, corr: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts,
            "dur": 0.3, "args": {"correlation": corr, "cbid": 211}}
