"""`servelab tune verify DIR`: check tuned config files and re-time them against what the
engine ships and against its default.

For every engine config file in DIR: the name parses, every entry's keys are valid, the
device in the name is the one at hand (else a warning), and which of the 18 default batch
sizes are missing. Then per (N, K, M) three configs are timed alternately (tuned, shipped,
default, twice) with the tuner's timing method, on the engine's own kernel when the engine
is importable (else servelab's): the tuned entry, the entry the engine's shipped file gives
for that M (nearest M, as the engine looks it up; the default when it ships none) and the
engine default. A tuned config that fails to launch is reported per point and makes the
command fail.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from servelab.errors import UserError
from servelab.kernels.fp8_gemm import engine as engine_kernel
from servelab.kernels.fp8_gemm import formats, reference
from servelab.kernels.fp8_gemm.configs import default_config, nearest
from servelab.kernels.fp8_gemm.engine import ENGINES
from servelab.tune import search, space
from servelab.tune.install import BACKUP_DIR, MANIFEST
from servelab.tune.timing import Problem, warm_up_gpu


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
    shipped: str | None = None    # the engine's shipped config for this M (None: it ships none)
    shipped_us: float | None = None
    error: str | None = None      # why the tuned config failed to launch

    @property
    def speedup(self) -> float | None:
        """Over the engine default."""
        if self.tuned_us and self.default_us:
            return self.default_us / self.tuned_us
        return None

    @property
    def vs_shipped(self) -> float | None:
        """Over what the engine ships (over its default where it ships nothing)."""
        base = self.shipped_us if self.shipped is not None else self.default_us
        if self.tuned_us and base:
            return base / self.tuned_us
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


def shipped_entries(engine: str, name: str, folder: Path | None) -> dict[int, dict] | None:
    """The entries the engine ships under file name `name`: from `folder` (its config folder),
    or from the backup `servelab tune install` made when a tuned file replaced it; None when
    the engine ships no such file."""
    if folder is None:
        return None
    backup = folder / BACKUP_DIR
    manifest = json.loads((backup / MANIFEST).read_text()) if (backup / MANIFEST).exists() else {}
    if name in manifest:
        path = backup / name if manifest[name].get("replaced") else None
    else:
        path = folder / name
    if path is None or not path.exists():
        return None
    try:
        return formats.read_config_file(path)
    except ValueError as exc:
        raise UserError(f"the engine's shipped file is malformed: {exc}") from None


def verify(directory: Path, device: str = "cuda", batch_sizes: tuple[int, ...] | None = None,
           engine: str = "sglang", kernel: str = "auto", shipped_dir: Path | None = None,
           ) -> tuple[list[FileCheck], list[VerifyRow], str, str]:
    """Check the files and time tuned vs shipped vs default per point; returns (checks, rows,
    device name, label of the kernel timed)."""
    if device not in ("cuda", "cpu"):      # checked first: torch would fail with a traceback
        raise UserError(f"--device {device}: choose cuda or cpu")
    if engine not in ENGINES:
        raise UserError(f"--engine {engine}: choose one of {', '.join(ENGINES)}")
    if shipped_dir is not None and not shipped_dir.is_dir():  # else read as "ships nothing"
        raise UserError(f"--shipped {shipped_dir}: not a folder; give the engine's config "
                        "folder (or leave it out to find it in this interpreter)")
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    checks = check_dir(directory)
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise UserError("no CUDA device here; use --device cpu to run the interpreter")
        here = formats.device_file_name(torch.cuda.get_device_name(), engine)
        warm_up_gpu()
    else:
        here = formats.CPU_DEVICE_NAME
    if kernel == "auto":
        kernel = engine if engine_kernel.package_dir(engine) is not None else "servelab"
    ek = engine_kernel.load(kernel)
    folder = shipped_dir or engine_kernel.config_dir(engine)
    seen: set[tuple[int, int]] = set()
    rows: list[VerifyRow] = []
    default = space.Config.from_engine(default_config(engine))
    for fc in checks:
        if (fc.n, fc.k) in seen or fc.fmt != engine and any(
                c.fmt == engine and (c.n, c.k) == (fc.n, fc.k) for c in checks):
            continue                              # the same shape in the other engine's name
        seen.add((fc.n, fc.k))
        shipped_file = shipped_entries(engine, formats.config_file_name(
            engine, fc.n, fc.k, fc.device), folder)
        for m in batch_sizes or fc.batch_sizes:
            tuned = space.Config.from_engine(nearest(fc.entries, m))
            shipped = (space.Config.from_engine(nearest(shipped_file, m))
                       if shipped_file else None)
            prob = Problem(fc.n, fc.k, m, device, seed=fc.n + fc.k + m, kernel=ek)
            arms = [tuned, default] + ([shipped] if shipped is not None else [])
            got: dict[int, list[float | None]] = {i: [] for i in range(len(arms))}
            err = None
            for _ in range(2):                     # ABCABC: drift hits all alike
                for i, c in enumerate(arms):
                    x = prob.time(c, search.HIGH_REPS)
                    got[i].append(x.time_us)
                    if i == 0 and x.error:
                        err = x.error
            mean = [None if None in v else sum(v) / len(v) for v in got.values()]
            tu = mean[0]
            tf = reference.flops(m, fc.n, fc.k) / (tu * 1e-6) / 1e12 if tu else None
            rows.append(VerifyRow(fc.n, fc.k, m, tuned.key, tu, mean[1], tf,
                                  shipped.key if shipped is not None else None,
                                  mean[2] if shipped is not None else None, err))
    return checks, rows, here, ek.label
