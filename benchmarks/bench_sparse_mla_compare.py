"""`bench_sparse_mla.py --compare`: the merge variants at B <= 8 (two kernels, PDL, 16-bit
partials) and the two Triton FP8 kernels against bf16 (the issue-5 follow-ups), all cells
compiled first (so GPU tests may run meanwhile: --wait-file), then timed like the main table.
(The fused merge these cells once timed lost everywhere and was removed: docs/notes.)"""

from __future__ import annotations

import time

import sparse_mla_common as bsm
import torch
from sparse_mla_common import (
    BATCHES,
    Log,
    Shape,
    check_correct,
    fp8_cache,
    make_inputs,
    run_cell,
    variant_calls,
)


def compare_jobs(shape: Shape, smoke: bool):
    """(B, label, variant, config) cells of --compare: merge variants at small B (two-kernel vs
    PDL), then FP8 (the reshape path vs per-chunk scales) vs bf16 on the memory-bound TP
    slices and V4-Flash."""
    from dataclasses import replace

    from servelab.kernels.sparse_mla.dispatch.defaults import default_config

    def base(b, fp8_tile=None):
        # The Triton kernels' defaults: these cells compare merges and FP8 paths of those
        # kernels (the Gluon default would change the split kernel under them).
        return default_config(b, shape.heads, shape.d_qk, fp8_tile, gluon=False)

    for b in [1, 3] if smoke else [1, 2, 4, 8]:
        c = base(b)
        yield b, "m-kernel", "splitkv", replace(c, merge="kernel")
        yield b, "m-pdl", "splitkv", replace(c, merge="pdl")
        if b <= 2:  # the B=1 follow-up: half the partial bytes (16-bit or half the splits)
            yield b, "m-pdl-p16", "splitkv", replace(c, merge="pdl", partial_dtype="input")
            yield b, "m-pdl-t2", "splitkv", replace(c, merge="pdl", min_tiles_per_split=2)
    if shape.heads < 64 or shape.name == "v4-flash" or smoke:
        batches = [1, 3] if smoke else [16, 32, 64, 128]
        if shape.name == "v4-flash":
            batches = BATCHES
        tile = 128 if shape.d_qk == 576 else 64 if shape.d_qk == 512 else 16  # fp8_cache's
        for b in batches:
            c = base(b)
            f = base(b, tile)
            yield b, "bf16", "splitkv", c
            yield b, "fp8-old", "fp8", replace(f, kernel="triton")  # the reshape path
            yield b, "fp8-new", "fp8", replace(f, kernel="triton_fp8_chunked")
            if shape.heads < 64 or smoke:  # geometry alternatives for the memory-bound slices
                yield b, "bf16-w8", "splitkv", replace(c, num_warps=8)
                for label, alt in FP8_ALTS.items():
                    yield b, label, "fp8", replace(f, kernel="triton_fp8_chunked", **alt)


# FP8 geometries tried on the TP slices next to the default (16 heads, 32 tokens, 4 warps,
# 3 stages): the per-chunk kernel keeps 8 chunk tiles live between the two dots, so more warps
# or fewer tokens per tile cut registers per thread (compiler report: 255 + spills at 4 warps).
FP8_ALTS = {
    "fp8-w8": {"num_warps": 8},
    "fp8-bn16": {"block_n": 16},
    "fp8-bn64w8": {"block_n": 64, "num_warps": 8, "num_stages": 2, "ctas_per_sm": 1},
}
FP8_COLS = ["bf16", "bf16-w8", "fp8-old", "fp8-new", *FP8_ALTS]


def compare(log: Log, args, shapes, reps: int, pool: int) -> None:
    """--compare: compile every cell first (while the GPU tests may still run, see
    --wait-file), then time them all; a merge table and an FP8 table last."""
    dtype = torch.float16 if bsm.DEVICE == "cpu" else torch.bfloat16
    data = {}
    for shape in shapes:
        torch.manual_seed(0)
        kv = torch.randn(pool, shape.d_qk, device=bsm.DEVICE).to(dtype)
        data[shape.name] = (kv, fp8_cache(shape, kv))
        log.row({"check": check_correct(log, shape, kv, data[shape.name][1])})
    jobs = [(shape, *j) for shape in shapes for j in compare_jobs(shape, args.smoke)
            if not args.only or j[1].startswith(tuple(args.only.split(",")))]  # fmt: skip
    # Most wanted first (a --budget-s cut loses the rest): merges at B=1, FP8 on the TP
    # slices, then the other merge cells, then V4-Flash FP8.
    jobs.sort(key=lambda j: 0 if j[1] == 1 and j[2].startswith("m-") else
              1 if j[0].heads < 64 and not j[2].startswith("m-") else 2 if j[2].startswith("m-")
              else 3)  # fmt: skip
    t0 = time.time()
    for shape, b, label, variant, cfg in jobs:  # compile (and load) everything once
        kv, cache = data[shape.name]
        sets = make_inputs(shape, b, kv, 1, seed=b)
        try:
            variant_calls(variant, shape, sets, kv, cfg=cfg, cache=cache)[0]()
        except Exception as e:  # noqa: BLE001 - reported again by run_cell
            log.say(f"compile {shape.name} B={b} {label}: {type(e).__name__}: {str(e)[:160]}")
    if bsm.DEVICE == "cuda":
        torch.cuda.synchronize()
    log.say(f"compiled {len(jobs)} cells in {time.time() - t0:.0f} s")
    bsm.wait_for_file(log, args.wait_file, t0)
    res = {}
    for shape, b, label, variant, cfg in jobs:
        if time.time() - t0 > args.budget_s:
            log.say(f"time budget spent: skipping {shape.name} B={b} {label}")
            continue
        kv, cache = data[shape.name]
        rec = run_cell(log, shape, b, kv, variant, reps, 128, cfg=cfg, cache=cache, label=label)
        res[(shape.name, b, label)] = rec
    nan = float("nan")

    def us(key):
        return res.get(key, {}).get("us", nan)

    mlabels = ["m-kernel", "m-pdl", "m-pdl-p16", "m-pdl-t2"]
    log.say("\nmerge: us per call (median; splits in brackets); best marked *")
    log.say(f"{'shape':17} {'B':>3} " + " ".join(f"{m[2:]:>14}" for m in mlabels))
    for shape in shapes:
        for b in sorted({k[1] for k in res if k[0] == shape.name and k[2] in mlabels}):
            vals = [us((shape.name, b, m)) for m in mlabels]
            best = min(v for v in vals if v == v) if any(v == v for v in vals) else nan
            cells = [f"{v:7.2f}{'*' if v == best else ' '}[{res.get((shape.name, b, m), {}).get('num_splits', 0):>3}] "
                     for v, m in zip(vals, mlabels, strict=True)]  # fmt: skip
            log.say(f"{shape.name:17} {b:>3} " + " ".join(f"{c:>14}" for c in cells))
    log.say("\nFP8: us per call (median); x old / x new = best bf16 / fp8-old, best fp8-new*;"
            " TB/s, %floor, regs, smem of the best fp8-new*")
    log.say(f"{'shape':17} {'B':>4} " + " ".join(f"{c:>10}" for c in FP8_COLS)
            + f" {'x old':>6} {'x new':>6} {'TB/s':>5} {'%floor':>6} {'regs':>4} {'smem':>6}")
    for shape in shapes:
        for b in sorted({k[1] for k in res if k[0] == shape.name and k[2] == "fp8-new"}):
            k = (shape.name, b)
            bf = min((us((*k, c)) for c in ("bf16", "bf16-w8")), key=lambda v: (v != v, v))
            news = [c for c in FP8_COLS if c.startswith("fp8-") and c != "fp8-old"]
            best = min(news, key=lambda c: (us((*k, c)) != us((*k, c)), us((*k, c))))
            n = res.get((*k, best), {})
            log.say(f"{shape.name:17} {b:>4} " + " ".join(f"{us((*k, c)):>10.2f}" for c in FP8_COLS)
                    + f" {bf / us((*k, 'fp8-old')):>6.2f} {bf / us((*k, best)):>6.2f}"
                    f" {n.get('tbs', nan):>5.2f} {n.get('pct_floor', nan):>6.1f}"
                    f" {n.get('split_regs')!s:>4} {n.get('split_smem')!s:>6} {best}")
