"""`servelab tune verify DIR`: check tuned config files and re-time tuned vs default configs.

For every engine config file in DIR: the name parses, the entries have the six keys, the
device in the name is the one at hand (else a warning), and which of the 18 default batch
sizes are missing. Then per (N, K, M) the tuned entry and the engine default are timed
alternately (tuned, default, tuned, default) with the tuner's timing method; the result is
the speedup per point and its geometric mean.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from servelab.errors import UserError
from servelab.kernels.fp8_gemm import formats
from servelab.tune import search, space


@dataclass(frozen=True, slots=True)
class VerifyRow:
    """One (N, K, M) point of a verify run."""

    n: int
    k: int
    m: int
    tuned: str
    tuned_us: float | None
    default_us: float | None
    tflops: float | None          # of the tuned config

    @property
    def speedup(self) -> float | None:
        if self.tuned_us and self.default_us:
            return self.default_us / self.tuned_us
        return None


@dataclass(frozen=True, slots=True)
class FileCheck:
    """What the static check of one file found."""

    path: Path
    fmt: str
    n: int
    k: int
    device: str
    entries: dict[int, dict[str, int]]   # as read and validated, by M in file order
    missing_default: tuple[int, ...]

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(self.entries)


def check_dir(directory: Path) -> list[FileCheck]:
    """Parse and validate every engine config file in `directory`; UserError on a bad one."""
    if not directory.is_dir():
        raise UserError(f"{directory}: not a folder; give the --out folder of a tuning run")
    out = []
    for p in sorted(directory.iterdir()):
        parsed = formats.parse_file_name(p.name)
        if parsed is None:
            continue
        try:
            entries = formats.read_config_file(p)
        except ValueError as exc:
            raise UserError(f"malformed config file: {exc}") from exc
        out.append(FileCheck(p, parsed.fmt, parsed.n, parsed.k, parsed.device, entries,
                             tuple(m for m in space.DEFAULT_BATCH_SIZES if m not in entries)))
    if not out:
        raise UserError(f"{directory}: no SGLang/vLLM block-FP8 config files "
                        "(N=...,K=...,device_name=...,dtype=fp8_w8a8,block_shape=[128, 128].json)")
    return out


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def verify(directory: Path, device: str = "cuda", batch_sizes: tuple[int, ...] | None = None,
           engine: str = "sglang") -> tuple[list[FileCheck], list[VerifyRow], str]:
    """Check the files and time tuned vs default per point; returns (checks, rows, device name)."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    from servelab.kernels.fp8_gemm import reference
    from servelab.kernels.fp8_gemm.configs import default_config, nearest
    from servelab.tune.timing import Problem
    checks = check_dir(directory)
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise UserError("no CUDA device here; use --device cpu to run the interpreter")
        here = formats.device_file_name(torch.cuda.get_device_name())
        from servelab.tune.timing import warm_up_gpu
        warm_up_gpu()
    else:
        here = formats.CPU_DEVICE_NAME
    seen: set[tuple[int, int]] = set()
    rows: list[VerifyRow] = []
    default = space.Config.from_engine(default_config(engine))
    for fc in checks:
        if (fc.n, fc.k) in seen:
            continue                              # the same shape in the other engine's name
        seen.add((fc.n, fc.k))
        for m in batch_sizes or fc.batch_sizes:
            tuned = space.Config.from_engine(nearest(fc.entries, m))
            prob = Problem(fc.n, fc.k, m, device, seed=fc.n + fc.k + m)
            t, d = [], []
            for _ in range(2):                     # ABAB: drift hits both alike
                t.append(prob.time(tuned, search.HIGH_REPS).time_us)
                d.append(prob.time(default, search.HIGH_REPS).time_us)
            tu = None if None in t else sum(t) / 2
            du = None if None in d else sum(d) / 2
            tf = reference.flops(m, fc.n, fc.k) / (tu * 1e-6) / 1e12 if tu else None
            rows.append(VerifyRow(fc.n, fc.k, m, tuned.key, tu, du, tf))
    return checks, rows, here
