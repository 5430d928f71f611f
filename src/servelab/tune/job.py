"""A tuning job: units of (shape, M), largest first, resumable, written as engine config files.

`run(spec)` starts the backend (local processes or Ray), reads the checkpoint, hands out the
units not done yet, appends every record to the checkpoint as it arrives, and after each
finished unit merges that shape's entries into its config files (atomic rename, one writer:
this process). A rerun of the same command resumes and says so.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab import jobs, provenance
from servelab.errors import UserError
from servelab.kernels.fp8_gemm import engine as engine_kernel
from servelab.kernels.fp8_gemm import formats
from servelab.tune import checkpoint, search, space, timing
from servelab.tune.workers import Assignment, LocalPool, RayPool, WorkSpec

Echo = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class TuneSpec:
    """One tuning job, as the CLI parsed it."""

    shapes: tuple[tuple[int, int], ...]
    out_dir: Path
    batch_sizes: tuple[int, ...] = space.DEFAULT_BATCH_SIZES
    search: str = "fast"
    gpus: tuple[str, ...] = ("0",)
    ray: str | None = None
    formats: tuple[str, ...] = formats.FORMATS
    device: str = "cuda"
    space: str | None = None            # default: "full" on cuda, "tiny" on cpu
    budget_frac: float = 0.2
    name: str = "tune"
    compile_workers: int = 0
    # whose launcher is timed: "auto" = the first of the formats' engines importable here
    # (its own kernel reads the files), else servelab's kernel
    kernel: str = "auto"

    def __post_init__(self) -> None:
        if not self.shapes:
            raise UserError("no shapes: give at least one --shape N,K")
        for n, k in self.shapes:
            if n <= 0 or k <= 0:
                raise UserError(f"shape N={n},K={k}: N and K must be positive")
        if not self.batch_sizes or min(self.batch_sizes) <= 0:
            raise UserError("batch sizes must be positive integers, e.g. --batch-sizes 1,2,4")
        if self.search not in search.SEARCHES:
            raise UserError(f"--search {self.search}: choose one of {', '.join(search.SEARCHES)}")
        if self.device not in ("cuda", "cpu"):
            raise UserError(f"--device {self.device}: choose cuda or cpu")
        for f in self.formats:
            if f not in formats.FORMATS:
                raise UserError(f"--format {f}: choose sglang, vllm or both")
        if self.space is not None and self.space not in space.SPACES:
            raise UserError(f"space {self.space}: choose one of {', '.join(space.SPACES)}")
        if not 0 < self.budget_frac <= 1:
            raise UserError("budget fraction must be in (0, 1]")
        if self.kernel not in ("auto", *engine_kernel.KERNELS):
            raise UserError(f"--kernel {self.kernel}: choose auto, "
                            f"{', '.join(engine_kernel.KERNELS)}")

    @property
    def kernel_name(self) -> str:
        """The launcher timed: the named one, or for "auto" the first engine of `formats`
        installed in this interpreter (on the CPU: servelab's, the interpreter's target)."""
        if self.kernel != "auto":
            return self.kernel
        if self.device == "cuda":
            for eng in self.formats:
                if engine_kernel.package_dir(eng) is not None:
                    return eng
        return "servelab"

    @property
    def space_name(self) -> str:
        return self.space or ("full" if self.device == "cuda" else "tiny")


@dataclass
class Report:
    """What a job did: unit records by (N, K, M), how long, where the files are."""

    units: dict[tuple[int, int, int], dict[str, Any]] = field(default_factory=dict)
    failed: list[dict[str, Any]] = field(default_factory=list)
    resumed_units: int = 0
    reused_measurements: int = 0
    seconds: float = 0.0
    device_name: str = ""
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # e.g. a format's file not written


def _fmt_s(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    s = int(s)
    return f"{s // 60}m{s % 60:02d}s"


def _write_shape(spec: TuneSpec, info: dict[str, Any], n: int, k: int,
                 units: dict[tuple[int, int, int], dict[str, Any]],
                 final: bool = True) -> list[Path]:
    """Merge a shape's finished entries into its files. A format whose engine may not read
    every key the timed kernel can choose (vLLM's file while tuning on SGLang's kernel) is
    written only once all units are in (`final`), and not at all if an entry needs such a key,
    so no partial file is left behind."""
    entries = {m: u["best"] for (un, uk, m), u in units.items() if (un, uk) == (n, k) and u.get("best")}
    if not entries:
        return []
    out = []
    for fmt in spec.formats:
        p = spec.out_dir / formats.config_file_name(fmt, n, k, info["device_name"])
        if not final and info.get("kernel_extra_keys", frozenset()) - \
                formats.ENGINE_EXTRA_KEYS[fmt]:
            continue
        unreadable = {m: bad for m, e in entries.items() if (bad := formats.unreadable_keys(fmt, e))}
        if unreadable:     # its engine would run other configs than those timed: no file
            note = (f"{p.name} not written: entries at M={sorted(unreadable)} use "
                    f"{sorted({x for b in unreadable.values() for x in b})}, which {fmt}'s "
                    f"kernel does not read (tune with --kernel {fmt} --format {fmt} for it)")
            if note not in info.setdefault("notes", []):
                info["notes"].append(note)
            continue
        formats.merge_write_config(p, entries)
        out.append(p)
    meta = {"tool": "servelab tune", "device_name": info["device_name"], "triton": info["triton"],
            "torch": info["torch"], "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "timing_method": timing.method(spec.device),
            "timings_meaningless": spec.device != "cuda", "search": spec.search,
            "space": spec.space_name, "budget_frac": spec.budget_frac,
            "servelab_git_sha": provenance.git_sha(), "N": n, "K": k,
            "kernel": info.get("kernel", "servelab kernels/fp8_gemm/kernel.py")}
    points = {m: {"config": u["best"], "time_us": u["us"], "default_us": u.get("default_us"),
                  "baseline": u.get("baseline"), "baseline_config": u.get("baseline_config"),
                  "timed": u.get("timed"), "candidates": u.get("candidates"),
                  "failed": u.get("failed")}
              for (un, uk, m), u in units.items() if (un, uk) == (n, k) and u.get("best")}
    side = spec.out_dir / formats.side_file_name(n, k, info["device_name"])
    formats.merge_write_side(side, meta, points)
    return [*out, side]


def run(spec: TuneSpec, echo: Echo = print, argv: list[str] | None = None,
        progress: Callable[[int, int, float | None], None] | None = None) -> Report:
    """Run (or resume) a tuning job; returns its report. `progress(done, total, eta_s)` is called
    after each unit (the CLI draws a bar with it)."""
    t0 = time.time()
    spec.out_dir.mkdir(parents=True, exist_ok=True)
    kernel = spec.kernel_name
    ws = WorkSpec(spec.device, spec.search, spec.space_name, spec.budget_frac,
                  compile_workers=spec.compile_workers, kernel=kernel)
    backend = RayPool(ws, spec.ray, echo) if spec.ray else LocalPool(ws, list(spec.gpus), echo)
    info = backend.start()
    ek = engine_kernel.load(kernel)
    info["kernel"], info["kernel_extra_keys"] = ek.label, ek.extra_keys
    echo(f"timing on: {info['kernel']}")
    ctx = checkpoint.context_id(device=info["device_name"], method=timing.method(spec.device),
                                triton=info["triton"], space=spec.space_name + "|" + kernel)
    ws = WorkSpec(spec.device, spec.search, spec.space_name, spec.budget_frac, ctx,
                  spec.compile_workers, kernel)
    backend.spec = ws
    ckpt = checkpoint.Checkpoint(spec.out_dir / checkpoint.FILE_NAME)
    state = ckpt.load(ctx, spec.search)
    rep = Report(device_name=info["device_name"])

    all_units = sorted({(n, k, m) for n, k in spec.shapes for m in spec.batch_sizes},
                       key=lambda u: (-u[0] * u[1] * u[2], u))
    done = {u: state.units[u] for u in all_units if u in state.units}
    rep.units.update(done)
    pending = [u for u in all_units if u not in done]
    rep.resumed_units = len(done)
    if spec.device != "cuda":
        echo("note: --device cpu runs Triton's interpreter; timings are MEANINGLESS for any GPU")
    if done or state.measurements:
        nmeas = sum(len(v) for k_, v in state.measurements.items() if k_ in set(pending))
        echo(f"resuming from {ckpt.path}: {len(done)}/{len(all_units)} units already done, "
             f"{nmeas} measurements of unfinished units reused"
             + (f", {state.torn_lines} torn line(s) skipped" if state.torn_lines else ""))
    ckpt.append({"t": "start", "ctx": ctx, "time": time.time(), "argv": argv or sys.argv,
                 "search": spec.search, "device_name": info["device_name"],
                 "units": len(all_units), "pending": len(pending)}, sync=True)
    for n, k in spec.shapes:
        rep.files += _write_shape(spec, info, n, k, rep.units, final=False)

    job = jobs.Job(spec.name, "tune", total=len(all_units))
    job.update(done=len(done), current="starting", device=info["device_name"], search=spec.search)
    queue_ = list(pending)
    started_at = time.time()
    new_done = 0

    def next_unit() -> Assignment | None:
        if not queue_:
            return None
        n, k, m = queue_.pop(0)
        same = sorted((abs(um - m), um) for (un, uk, um) in rep.units if (un, uk) == (n, k))
        hints: list[dict[str, int]] = []
        for _, um in same[:2]:
            best = rep.units[(n, k, um)].get("best")
            if best and best not in hints:
                hints.append(best)
        known = tuple(state.measurements.get((n, k, m), {}).values())
        rep.reused_measurements += len(known)
        job.update(current=f"N={n},K={k},M={m}")
        return Assignment(n, k, m, known, tuple(hints))

    def handle(rec: dict[str, Any]) -> None:
        nonlocal new_done
        t = rec.get("t")
        rec["ctx"] = ctx                      # workers started before the context was known
        if t == "m":
            ckpt.append(rec)
            return
        ckpt.append(rec, sync=True)
        key = (rec["n"], rec["k"], rec["m"])
        if t == "unit":
            rep.units[key] = rec
            new_done += 1
            _write_shape(spec, info, rec["n"], rec["k"], rep.units, final=False)
        elif t == "fail":
            rep.failed.append(rec)
            new_done += 1
        total_done = len(done) + new_done
        pace = (time.time() - started_at) / max(1, new_done)
        eta = pace * (len(all_units) - total_done)
        job.update(done=total_done, failed=len(rep.failed))
        if progress is not None:
            progress(total_done, len(all_units), eta)
        echo(_unit_line(rec, total_done, len(all_units), eta))

    state_name = "finished"
    try:
        if pending:
            backend.run(next_unit, handle)
    except KeyboardInterrupt:
        state_name = "interrupted"
        raise
    except Exception:
        state_name = "failed"
        raise
    finally:
        ckpt.close()
        backend.close()
        job.update(current="")
        job.finish(state_name)
    files = []
    for n, k in spec.shapes:
        files += _write_shape(spec, info, n, k, rep.units)
    rep.files = files
    rep.notes = list(info.get("notes", []))
    for note in rep.notes:
        echo(f"note: {note}")
    rep.seconds = time.time() - t0
    return rep


def _unit_line(rec: dict[str, Any], done: int, total: int, eta: float) -> str:
    """The progress line of one finished ("unit") or failed ("fail") unit."""
    where = f"[{done}/{total}] N={rec['n']},K={rec['k']},M={rec['m']}:"
    if rec.get("t") != "unit":
        return f"{where} FAILED ({str(rec.get('error', '')).strip().splitlines()[-1:]})"
    sp = (rec["default_us"] / rec["us"]) if rec.get("us") and rec.get("default_us") else None
    best = rec.get("best")
    label = space.Config.from_engine(best).key if best else "none"
    speed = f", {sp:.2f}x" if sp else ""
    nfail = f", {rec['failed']} failed" if rec.get("failed") else ""
    return (f"{where} {label} {_us(rec.get('us'))} (default {_us(rec.get('default_us'))}{speed}), "
            f"timed {rec.get('timed')}/{rec.get('candidates')}{nfail}, ETA {_fmt_s(eta)}")


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}us"
