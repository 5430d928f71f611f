"""Split-K vs the engines' one-pass block-FP8 GEMM at decode sizes (issue 6 follow-up).

At M <= 64 the GEMM should stream its weights (fp8 + block scales) at HBM speed. With N = 7168
the one-pass kernel launches only 56-112 column tiles for 132 SMs, each walking K = 18432
serially; SPLIT_K = s (an opt-in launch key of our kernel, not in the engines' six) gives every
tile s programs, each over a contiguous range of K scale groups, and reduces the fp32 partials.

For (N, K) in (7168, 18432), (18432, 7168) and M in 1, 16, 32, 64 this script
  1. compiles the config grid ahead in a process pool (one kernel per config serves every M);
  2. checks every config of the grid against the fp64 reference at M = 33 (not a multiple of
     any BLOCK_SIZE_M; poisoned output, elementwise bound, relative Frobenius error), both
     reductions for split-K; only configs that pass are timed;
  3. times the grid with the tuner's timer (`servelab.tune.timing.cuda_time_us`: CUDA-graph
     replays, inputs rotated over > 2x L2 so the weights are read from HBM);
  4. re-times the best SPLIT_K = 1 config, the best split-K config with each reduction, the
     reduction kernel alone, and `torch._scaled_mm` per-tensor fp8 (cuBLAS, no block scales)
     back to back, interleaved;
  5. prints the table last; the full log (splitk.log) and every number (splitk.json) are
     written under OUT.

Device:  PYTHONPATH=src python3 benchmarks/bench_fp8_splitk.py OUT [--budget-s 110]
CPU:     TRITON_INTERPRET=1 at tiny shapes: ... bench_fp8_splitk.py OUT --smoke  (proves the
         flow; its wall-clock timings are MEANINGLESS)
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import math
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from servelab.tune.timing import copy_rate_tbs, quartile_spread  # stdlib-only module (no torch)

HBM_COPY_TBS = 4.24      # H200 device-to-device copy rate measured 2026-11-29 (docs/FIELD.md)
HBM_PEAK_TBS = 4.8       # H200 datasheet
REDUCTIONS = ("workspace", "atomic")
REDUCE_ONLY = "splitk_reduce_only"


@dataclass(frozen=True, slots=True)
class Plan:
    """What one run measures, and within what time."""

    device: str
    shapes: tuple[tuple[int, int], ...]
    ms: tuple[int, ...]
    grid: dict[str, tuple[int, ...]]
    check_m: int
    sweep_reps: int
    final_rounds: int
    final_reps: int
    budget_s: float
    compile_workers: int

    @classmethod
    def for_device(cls, budget_s: float) -> Plan:
        return cls(
            device="cuda", shapes=((7168, 18432), (18432, 7168)), ms=(1, 16, 32, 64),
            # GROUP_SIZE_M 32 >= the <= 4 row-blocks at M <= 64: programs sharing a weight tile
            # run side by side (the weights are read once); BLOCK_SIZE_K 128 = one scale group.
            grid={"BLOCK_SIZE_M": (16, 32, 64), "BLOCK_SIZE_N": (32, 64, 128),
                  "BLOCK_SIZE_K": (128,), "GROUP_SIZE_M": (32,), "num_warps": (4,),
                  "num_stages": (3, 4, 5), "SPLIT_K": (1, 2, 3, 4, 6, 8)},
            check_m=33, sweep_reps=5, final_rounds=3, final_reps=10, budget_s=budget_s,
            compile_workers=max(1, min(15, (os.cpu_count() or 2) - 1)))

    @classmethod
    def smoke(cls, budget_s: float) -> Plan:
        return cls(
            device="cpu", shapes=((160, 384), (96, 640)), ms=(1, 5),
            grid={"BLOCK_SIZE_M": (16,), "BLOCK_SIZE_N": (32, 64), "BLOCK_SIZE_K": (128,),
                  "GROUP_SIZE_M": (32,), "num_warps": (4,), "num_stages": (3,),
                  "SPLIT_K": (1, 2, 3)},
            check_m=5, sweep_reps=1, final_rounds=1, final_reps=1, budget_s=budget_s,
            compile_workers=2)

    def configs(self, k: int) -> list[dict[str, int]]:
        """The grid, less splits with more parts than K has 128-wide scale groups."""
        keys = list(self.grid)
        cfgs = [dict(zip(keys, vals, strict=True))
                for vals in itertools.product(*self.grid.values())]
        return [c for c in cfgs if c["SPLIT_K"] <= math.ceil(k / 128)]


def key(cfg: dict[str, int]) -> str:
    """The tuner's compact id plus the split, e.g. 'm16n64k128g32w4s4/split3'."""
    base = (f"m{cfg['BLOCK_SIZE_M']}n{cfg['BLOCK_SIZE_N']}k{cfg['BLOCK_SIZE_K']}"
            f"g{cfg['GROUP_SIZE_M']}w{cfg['num_warps']}s{cfg['num_stages']}")
    return base + (f"/split{cfg['SPLIT_K']}" if cfg.get("SPLIT_K", 1) > 1 else "")


class Log:
    """Print and append to OUT/splitk.log (flushed, so a killed run keeps its lines)."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("w")

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self._f.write(line + "\n")
        self._f.flush()


# ---- compile ahead (spawned processes; the binaries land in Triton's on-disk cache) --------

_CHILD: dict = {}


def _child_init(device: str) -> None:
    import torch

    from servelab.kernels.fp8_gemm import reference as R
    # N, K and every stride but the unspecialized ones (M, scale and workspace strides) are
    # multiples of 16 as in the real shapes, so these tiny launches compile the same binaries.
    x, w = torch.randn(16, 1024, device=device), torch.randn(256, 1024, device=device)
    _CHILD["args"] = R.quantize_per_token_group(x) + R.quantize_weight_per_block(w)
    _CHILD["device"] = device


def _child_compile(cfg: dict[str, int]) -> str | None:
    import torch

    from servelab.kernels.fp8_gemm import kernel as K
    try:
        for reduce in REDUCTIONS if cfg.get("SPLIT_K", 1) > 1 else REDUCTIONS[:1]:
            K.w8a8_block_fp8_matmul(*_CHILD["args"], cfg, split_k_reduce=reduce)
        if _CHILD["device"] == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - reported; the config is left out
        return f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    return None


def compile_ahead(plan: Plan, cfgs: list[dict[str, int]], deadline: float,
                  log: Log) -> dict[str, str]:
    """Compile one launch per kernel variant (split-K compiles once for every SPLIT_K > 1: it
    is a runtime argument) in a pool; returns {variant key: error} for those that failed. Only
    reported: the check in this process decides which configs run (a child can fail for its
    own reasons, e.g. memory with 15 CUDA contexts)."""
    reps: dict[str, dict[str, int]] = {}
    for c in cfgs:
        rep = dict(c, SPLIT_K=min(c["SPLIT_K"], 2))
        reps.setdefault(key(rep), rep)
    t0 = time.perf_counter()
    pool = cf.ProcessPoolExecutor(max_workers=min(plan.compile_workers, len(reps)),
                                  mp_context=mp.get_context("spawn"), initializer=_child_init,
                                  initargs=(plan.device,))
    procs = []
    errors: dict[str, str] = {}
    try:
        futs = {pool.submit(_child_compile, c): k for k, c in reps.items()}
        procs = list(getattr(pool, "_processes", {}).values())
        done, pending = cf.wait(futs, timeout=max(1.0, deadline - time.time()))
        for f in done:
            if (err := f.result()) is not None:
                errors[futs[f]] = err
        log(f"compile-ahead: {len(done)}/{len(reps)} kernel variants in "
            f"{time.perf_counter() - t0:.1f} s on {plan.compile_workers} processes, "
            f"{len(errors)} failed, {len(pending)} left to compile on first launch")
    except Exception as exc:  # noqa: BLE001 - compile on first launch instead
        log(f"compile-ahead off ({type(exc).__name__}: {exc}); compiling on first launch")
    finally:
        procs = procs or list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:              # our own pool's processes, by handle
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
    return errors


# ---- inputs, launches, timing ----------------------------------------------------------------

def _inputs(n: int, k: int, m: int, device: str, seed: int) -> tuple:
    import torch

    from servelab.kernels.fp8_gemm import reference as R
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, generator=gen, device=device)
    w = torch.randn(n, k, generator=gen, device=device) * 0.05
    return R.quantize_per_token_group(x) + R.quantize_weight_per_block(w)


def _gemm_launcher(prob, cfg: dict[str, int], reduce: str, workspace=None):
    """A launch that reads the next of the problem's rotated input copies each call; split-K
    uses the point's one preallocated fp32 buffer (no allocation inside the timed graphs)."""
    from servelab.kernels.fp8_gemm import kernel as K
    turn = itertools.count()

    def launch() -> None:
        a_q, a_s, b_q, b_s = prob.sets[next(turn) % len(prob.sets)]
        K.w8a8_block_fp8_matmul(a_q, a_s, b_q, b_s, cfg, out=prob.out, split_k_reduce=reduce,
                                workspace=workspace)
    return launch


def _cublas_launcher(prob):
    """torch._scaled_mm per-tensor fp8 (cuBLAS): same fp8 bytes, no block scales."""
    import torch
    one = torch.ones((), device=prob.device)
    turn = itertools.count()

    def launch() -> None:
        a_q, _, b_q, _ = prob.sets[next(turn) % len(prob.sets)]
        torch._scaled_mm(a_q, b_q.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return launch


def _reduce_launcher(prob, split_k: int):
    """The workspace reduction alone ([s, M, N] fp32 partials into the bf16 output): its share
    of the split-K time, and so what fusing it into the GEMM could save at most."""
    import torch

    from servelab.kernels.fp8_gemm import kernel as K
    parts = torch.randn((split_k, prob.m, prob.n), device=prob.device)

    def launch() -> None:
        K.splitk_reduce(parts, prob.out)
    return launch


def _times_us(plan: Plan, launch, reps: int, copies: int) -> list[float]:
    """Per-call times: the tuner's CUDA-graph timer on CUDA; one wall-clock call after a warm
    one in the interpreter (meaningless as GPU time; labelled so)."""
    if plan.device == "cuda":
        from servelab.tune.timing import cuda_time_us
        return cuda_time_us(launch, reps, min_calls=copies)
    launch()
    t0 = time.perf_counter()
    launch()
    return [(time.perf_counter() - t0) * 1e6]


@dataclass(frozen=True, slots=True)
class Timing:
    """One (config, reduction) timed on one (N, K, M); time_us None when it failed."""

    n: int
    k: int
    m: int
    config: str
    split_k: int
    reduce: str | None            # None for SPLIT_K = 1 and cuBLAS
    time_us: float | None
    spread_us: float | None       # half the interquartile range of the per-replay values
    reps: int
    error: str | None = None


def _time(plan: Plan, prob, name: str, split_k: int, reduce: str | None, launch,
          reps: int) -> Timing:
    try:
        ts = _times_us(plan, launch, reps, len(prob.sets))
    except Exception as exc:  # noqa: BLE001 - a failing config is noted and skipped
        return Timing(prob.n, prob.k, prob.m, name, split_k, reduce, None, None, 0,
                      f"{type(exc).__name__}: {str(exc).strip()[:200]}")
    return Timing(prob.n, prob.k, prob.m, name, split_k, reduce, statistics.median(ts),
                  quartile_spread(ts), len(ts))


# ---- correctness at one M ----------------------------------------------------------------------

def check_shape(plan: Plan, n: int, k: int, cfgs: list[dict[str, int]], deadline: float,
                log: Log) -> list[dict]:
    """Every config (split-K with both reductions) against the fp64 reference at M = check_m,
    until `deadline` (configs left unchecked are not timed: a compile on first launch can take
    seconds each when the compile-ahead pool did not finish).
    Bound as bench_fp8_gemm.py's GPU check: |err| <= 2^-8 |ref| + 2^-7 sum|a b| (bf16 output
    rounding; Hopper's fp8 MMA adds with a short mantissa inside a K step), and relative
    Frobenius error <= 2^-7; the output is poisoned with NaN so every element must be written."""
    import torch

    from servelab.kernels.fp8_gemm import kernel as K
    from servelab.kernels.fp8_gemm import reference as R
    m = plan.check_m
    aq, as_, bq, bs = _inputs(n, k, m, plan.device, seed=n + k)
    ref = R.w8a8_block_matmul(aq, as_, bq, bs)
    bound = 2.0 ** -8 * ref.abs() + 2.0 ** -7 * R.abs_matmul(aq, as_, bq, bs)
    rows = []
    for cfg in cfgs:
        if time.time() > deadline:
            break
        for reduce in REDUCTIONS if cfg["SPLIT_K"] > 1 else (None,):
            row = {"n": n, "k": k, "m": m, "config": key(cfg), "split_k": cfg["SPLIT_K"],
                   "reduce": reduce, "outside_bound": None, "nan": None, "rel_err": None,
                   "ok": False, "error": None}
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=plan.device)
            try:
                K.w8a8_block_fp8_matmul(aq, as_, bq, bs, cfg, out=out,
                                        split_k_reduce=reduce or "workspace")
            except Exception as exc:  # noqa: BLE001 - reported; the config is not timed
                row["error"] = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
                rows.append(row)
                continue
            err = (out.double() - ref).abs()
            row["nan"] = int(out.isnan().sum())
            row["outside_bound"] = int((err > bound).sum())
            row["rel_err"] = float((out.double() - ref).norm() / ref.norm())
            row["ok"] = row["nan"] == 0 and row["outside_bound"] == 0 and row["rel_err"] <= 2 ** -7
            rows.append(row)
    good = sum(r["ok"] for r in rows)
    rels = [r["rel_err"] for r in rows if r["rel_err"] is not None]
    unchecked = len(cfgs) - len({r["config"] for r in rows})
    log(f"check N={n} K={k} M={m}: {good}/{len(rows)} (config, reduction) pairs within the bound"
        f" and written everywhere; rel. Frobenius error {min(rels, default=float('nan')):.2e}"
        f"..{max(rels, default=float('nan')):.2e}"
        + (f"; {unchecked} configs NOT checked (time budget) and not timed" if unchecked else ""))
    for r in rows:
        if not r["ok"]:
            log(f"  FAIL {r['config']} {r['reduce']}: {r['error'] or ''} "
                f"outside={r['outside_bound']} nan={r['nan']} rel={r['rel_err']}")
    return rows


# ---- one (N, K, M) point: sweep, then finalists back to back -----------------------------------

def _weight_row(t: Timing | None, n: int, k: int) -> dict | None:
    from servelab.kernels.fp8_gemm import reference as R
    if t is None or t.time_us is None:
        return None
    tbs = R.weight_bytes(n, k) / (t.time_us * 1e-6) / 1e12
    return {"config": t.config, "split_k": t.split_k, "reduce": t.reduce, "time_us": t.time_us,
            "spread_us": t.spread_us, "reps": t.reps, "weight_tbs": tbs,
            "pct_of_copy": 100 * tbs / HBM_COPY_TBS, "pct_of_peak": 100 * tbs / HBM_PEAK_TBS}


def run_point(plan: Plan, n: int, k: int, m: int, cfgs: list[dict[str, int]], sweep_end: float,
              log: Log) -> tuple[dict, list[Timing]]:
    """Time every config (shuffled, so a sweep cut by its deadline still covers every SPLIT_K),
    then re-time the finalists interleaved: the best one-pass config, the best split-K config
    with each reduction, and cuBLAS."""
    import torch

    from servelab.tune.timing import Problem
    prob = Problem(n, k, m, device=plan.device, seed=m)
    ws = torch.empty(max(plan.grid["SPLIT_K"]) * m * n, dtype=torch.float32, device=plan.device)
    order = list(cfgs)
    random.Random(f"{n},{k},{m}").shuffle(order)
    sweep: list[Timing] = []
    for cfg in order:
        if time.time() > sweep_end:
            break
        sweep.append(_time(plan, prob, key(cfg), cfg["SPLIT_K"], "workspace" if cfg["SPLIT_K"] > 1
                           else None, _gemm_launcher(prob, cfg, "workspace", ws), plan.sweep_reps))
    ok = [t for t in sweep if t.time_us is not None]
    by_split = {s: min((t for t in ok if t.split_k == s), key=lambda t: t.time_us, default=None)
                for s in plan.grid["SPLIT_K"]}
    log(f"N={n} K={k} M={m}: swept {len(sweep)}/{len(cfgs)} configs ({len(sweep) - len(ok)} "
        "failed); best per SPLIT_K: " + ", ".join(
            f"{s}: {t.time_us:.1f} us" if t else f"{s}: -" for s, t in by_split.items()))
    one = by_split.get(1)
    split = min((t for s, t in by_split.items() if s > 1 and t), key=lambda t: t.time_us,
                default=None)
    by_key = {key(c): c for c in cfgs}
    finalists: list[tuple[str, int, str | None, object]] = []
    if one:
        finalists.append((one.config, 1, None,
                          _gemm_launcher(prob, by_key[one.config], "workspace", ws)))
    if split:
        for reduce in REDUCTIONS:
            finalists.append((split.config, split.split_k, reduce,
                              _gemm_launcher(prob, by_key[split.config], reduce, ws)))
        finalists.append((REDUCE_ONLY, split.split_k, "workspace",
                          _reduce_launcher(prob, split.split_k)))
    finalists.append(("cublas_scaled_mm_per_tensor", 1, None, _cublas_launcher(prob)))
    samples: dict[int, list[float]] = {i: [] for i in range(len(finalists))}
    errors: dict[int, str] = {}
    for _ in range(plan.final_rounds):
        for i, (_name, _s, _r, launch) in enumerate(finalists):
            if i in errors:
                continue
            try:
                samples[i] += _times_us(plan, launch, plan.final_reps, len(prob.sets))
            except Exception as exc:  # noqa: BLE001 - e.g. _scaled_mm without CPU fp8 support
                errors[i] = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    final = [Timing(n, k, m, name, s, r, statistics.median(samples[i]) if samples[i] else None,
                    quartile_spread(samples[i]), len(samples[i]), errors.get(i))
             for i, (name, s, r, _l) in enumerate(finalists)]
    pick = {(t.split_k > 1, t.reduce): t for t in final[:-1] if t.config != REDUCE_ONLY}
    reduce_only = next((t for t in final if t.config == REDUCE_ONLY), None)
    row = {"n": n, "k": k, "m": m, "swept": len(sweep), "configs": len(cfgs),
           "one_pass": _weight_row(pick.get((False, None)), n, k),
           "split_k": _weight_row(pick.get((True, "workspace")), n, k),
           "split_k_atomic": _weight_row(pick.get((True, "atomic")), n, k),
           "cublas": _weight_row(final[-1], n, k), "cublas_error": final[-1].error,
           "reduce_only_us": reduce_only.time_us if reduce_only else None,
           "best_by_split_us": {s: (t.time_us if t else None) for s, t in by_split.items()}}
    a, b = row["one_pass"], row["split_k"]
    row["speedup"] = a["time_us"] / b["time_us"] if a and b else None
    del prob, ws, finalists           # the launchers hold the inputs
    if plan.device == "cuda":
        torch.cuda.empty_cache()
    return row, sweep + final


# ---- table -------------------------------------------------------------------------------------

def _short(cfg_key: str | None) -> str:
    """'m16n64k128g32w4s4/split3' -> 'm16n64s4 x3' (BLOCK_SIZE_K, GROUP_SIZE_M, warps fixed)."""
    if not cfg_key:
        return "-"
    base, _, split = cfg_key.partition("/split")
    mn, _, rest = base.partition("k")
    return f"{mn}s{rest.rpartition('s')[2]}" + (f" x{split}" if split else "")


def summary(rows: list[dict]) -> list[str]:
    """The goal per shape (>= 60% of the copy rate on the weight bytes at M <= 64) and the
    reduction choice (atomic / workspace time of the same best split config)."""
    lines = []
    for n, k in dict.fromkeys((r["n"], r["k"]) for r in rows):
        pts = [r for r in rows if (r["n"], r["k"]) == (n, k) and r["m"] <= 64]
        for label, f in (("one-pass", "one_pass"), ("best of one-pass/split-K", None)):
            pcts = [max((r[g]["pct_of_copy"] for g in ((f,) if f else ("one_pass", "split_k"))
                         if r[g]), default=None) for r in pts]
            got = [p for p in pcts if p is not None]
            if not got:
                continue
            verdict = "met" if len(got) == len(pcts) and min(got) >= 60 else "NOT met"
            lines.append(f"goal N={n} K={k} M<=64, {label}: {min(got):.0f}-{max(got):.0f}% of "
                         f"{HBM_COPY_TBS} TB/s over {len(got)}/{len(pcts)} points (>= 60%): "
                         f"{verdict}")
    ratios = [r["split_k_atomic"]["time_us"] / r["split_k"]["time_us"] for r in rows
              if r["split_k"] and r["split_k_atomic"]]
    if ratios:
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
        lines.append(f"reduction: atomic/workspace time, same config: geomean {gm:.3f} "
                     f"[{min(ratios):.3f}, {max(ratios):.3f}] over {len(ratios)} points "
                     "(workspace is the default: deterministic; atomic only if clearly faster)")
    return lines


def table(rows: list[dict], timing_note: str) -> list[str]:
    def cell(r: dict | None) -> str:
        if not r:
            return f"{'-':>17} {'-':>8} {'-':>5} {'-':>5} {'-':>5}"
        sp = f"±{r['spread_us']:.1f}" if r["spread_us"] is not None else ""
        return (f"{_short(r['config']):>17} {r['time_us']:>6.1f}{sp:<5} {r['weight_tbs']:>5.2f} "
                f"{r['pct_of_copy']:>4.0f}% {r['pct_of_peak']:>4.0f}%")

    def us(r: dict | None) -> str:
        return f"{r['time_us']:.1f}" if r else "-"
    head = (f"{'N':>6} {'K':>6} {'M':>3} | {'one-pass config':>17} {'us':>11} {'TB/s':>5} "
            f"{'%4.24':>5} {'%4.8':>5} | {'split-K config':>17} {'us':>11} {'TB/s':>5} "
            f"{'%4.24':>5} {'%4.8':>5} | {'speedup':>7} {'atomic_us':>9} {'reduce_us':>9} "
            f"{'cuBLAS_us':>9}")
    lines = [f"Weight bytes (fp8 + block scales) per time; % of {HBM_COPY_TBS} TB/s (H200 copy) "
             f"and {HBM_PEAK_TBS} TB/s (datasheet). {timing_note}", head, "-" * len(head)]
    for r in rows:
        sp = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        red = f"{r['reduce_only_us']:.1f}" if r["reduce_only_us"] is not None else "-"
        lines.append(f"{r['n']:>6} {r['k']:>6} {r['m']:>3} | {cell(r['one_pass'])} | "
                     f"{cell(r['split_k'])} | {sp:>7} {us(r['split_k_atomic']):>9} "
                     f"{red:>9} {us(r['cublas']):>9}")
    return lines


# ---- the run -----------------------------------------------------------------------------------

def run(plan: Plan, out: Path) -> int:
    from servelab import atomic, provenance
    from servelab.tune.timing import CPU_METHOD, CUDA_METHOD, warm_up_gpu
    t_start = time.time()
    t_end = t_start + plan.budget_s
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "splitk.log")
    method = CUDA_METHOD if plan.device == "cuda" else CPU_METHOD
    note = ("Times: median of CUDA-graph replays, weights not L2-resident; ± half the IQR."
            if plan.device == "cuda" else f"Times: {CPU_METHOD}.")
    doc: dict = {"plan": {**asdict(plan), "method": method},
                 "provenance": provenance.collect(benchmark="bench_fp8_splitk"),
                 "hbm_copy_tbs_reference": HBM_COPY_TBS, "hbm_peak_tbs": HBM_PEAK_TBS,
                 "copy_tbs_measured": None, "compile_errors": {}, "checks": [], "points": [],
                 "timings": []}
    log(f"split-K benchmark on {plan.device}; budget {plan.budget_s:.0f} s; method: {method}")

    def save() -> None:
        atomic.write_text(out / "splitk.json", json.dumps(doc, indent=1, default=str))

    all_cfgs = {key(c): c for n, k in plan.shapes for c in plan.configs(k)}
    doc["compile_errors"] = compile_ahead(plan, list(all_cfgs.values()),
                                          t_start + min(45.0, 0.35 * plan.budget_s), log)
    for name, err in doc["compile_errors"].items():
        log(f"  compile failed in the pool: {name}: {err}")
    if plan.device == "cuda":
        warm_up_gpu(1.0)
        doc["copy_tbs_measured"] = copy_rate_tbs()
        log(f"device-to-device copy this run: {doc['copy_tbs_measured']:.2f} TB/s (read+write); "
            f"percentages below use the reference {HBM_COPY_TBS} and {HBM_PEAK_TBS} TB/s")
    n_points = len(plan.shapes) * len(plan.ms)
    done = 0
    for n, k in plan.shapes:
        cfgs = plan.configs(k)
        checks = check_shape(plan, n, k, cfgs, time.time() + max(5.0, 0.25 * (t_end - time.time())),
                             log)
        doc["checks"] += checks
        passed = {r["config"] for r in checks if r["ok"]}
        failed = {r["config"] for r in checks if not r["ok"]}
        cfgs = [c for c in cfgs if key(c) in passed - failed]      # both reductions passed
        save()
        for m in plan.ms:
            left = n_points - done
            share = (t_end - 8.0 - time.time()) / left       # 8 s kept for the last writes
            if share < 1.0:
                log(f"N={n} K={k} M={m}: NOT RUN (time budget spent)")
                done += 1
                continue
            sweep_end = time.time() + 0.8 * share              # the rest for the finalists
            row, timings = run_point(plan, n, k, m, cfgs, sweep_end, log)
            doc["points"].append(row)
            doc["timings"] += [asdict(t) for t in timings]
            done += 1
            save()
    checks_ok = all(r["ok"] for r in doc["checks"])
    doc["checks_ok"] = checks_ok
    doc["wall_s"] = time.time() - t_start
    save()
    log()
    log(f"correctness at M={plan.check_m}: {sum(r['ok'] for r in doc['checks'])}/"
        f"{len(doc['checks'])} (config, reduction) pairs pass -> "
        f"{'PASS' if checks_ok else 'FAIL'}; wall {doc['wall_s']:.0f} s; "
        f"JSON {out / 'splitk.json'}")
    for line in summary(doc["points"]):
        log(line)
    for line in table(doc["points"], note):
        log(line)
    return 0 if checks_ok else 1


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="directory for splitk.log and splitk.json")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU, Triton interpreter, tiny shapes: the flow only, timings meaningless")
    ap.add_argument("--budget-s", type=float, default=110.0,
                    help="whole-run time budget in seconds (default 110)")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"          # before Triton is imported, for children too
        plan = Plan.smoke(args.budget_s)
    else:
        import torch
        if not torch.cuda.is_available():
            print("error: no CUDA device; use --smoke for the CPU flow check", file=sys.stderr)
            return 2
        plan = Plan.for_device(args.budget_s)
    return run(plan, args.out)


if __name__ == "__main__":
    rc = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Every result is written by now; skip interpreter teardown, which joins the compile pool's
    # manager thread (a pool shutdown was seen to hang on the H200 machine, 2026-11-29).
    os._exit(rc)
