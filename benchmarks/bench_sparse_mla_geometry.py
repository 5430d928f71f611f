"""Split-kernel geometries side by side on one GPU: the shipped default against candidates.

Each candidate is a `SplitConfig` (named below); every cell is first checked against the fp32
reference (relative error, padding rows), then timed exactly like bench_sparse_mla.py
(sparse_mla_common.py: CUDA graphs of rotated inputs so the gathered rows come from HBM,
median of replays; the same measured roofline ceilings). A candidate names its variant: one
that cannot run here is an error, never timed as another. All cells compile first, so GPU tests
can run meanwhile (--wait-file), and --budget-s stops starting new cells. A table is printed
last; OUT/bench_sparse_mla.jsonl holds every cell with its p10/p90 and compiler report.

    PYTHONPATH=src python3 benchmarks/bench_sparse_mla_geometry.py --out $OUT \\
        [--shapes v4-flash,v3.2] [--batches 32,64,128] [--only rp64-bn32,default]
    PYTHONPATH=src python3 benchmarks/bench_sparse_mla_geometry.py --fp8 --out $OUT  # FP8 KV
    PYTHONPATH=src python3 benchmarks/bench_sparse_mla_geometry.py --smoke --out /tmp/x  # CPU
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import sparse_mla_common as bsm
import torch

# A checked cell is timed only if its output is within this relative error of the fp32
# reference (bf16 P in the P V dot gives ~2e-3) and its all-padding request is exactly (0, -inf).
MAX_REL_ERR = 1e-2


def _nh(h: int, nbuf: int, fp8: bool = False):
    """The defaults' few-heads geometry for h <= 32 heads with an nbuf-deep ring."""
    from servelab.kernels.sparse_mla.dispatch.defaults import geometry

    name = ("nh16" if h <= 16 else "nh32") + ("_fp8" if fp8 else "")
    return replace(geometry(name), num_stages=nbuf)


def candidates(shape: bsm.Shape, b: int, split_costs: bool = False) -> dict:
    """label -> SplitConfig (None = the shipped default for this cell); `split_costs` adds the
    default with 16-bit partials, a PDL merge, and half or twice the splits at B >= 16."""
    from servelab.kernels.sparse_mla.dispatch.defaults import default_config, geometry
    from servelab.kernels.sparse_mla.gluon_kernels import nh as gluon_nh
    from servelab.kernels.sparse_mla.gluon_kernels.common import SMEM_LIMIT
    from servelab.kernels.sparse_mla.splitkv.geometry import SplitConfig as C

    out = {"default": None}
    dflt = default_config(b, shape.heads, shape.d_qk)
    ws = geometry("gluon_ws")
    if split_costs and b >= 16:  # the split's other costs: partial dtype, merge, split count
        for label, kw in (("p16", dict(partial_dtype="input")), ("pdl", dict(merge="pdl")),
                          ("p16-pdl", dict(partial_dtype="input", merge="pdl")),
                          ("waves0.5", dict(waves=0.5)), ("waves2", dict(waves=2.0))):  # fmt: skip
            out[label] = replace(dflt, **kw)
    if dflt != ws:
        out["ws"] = ws  # the warp-specialised Gluon kernel, where it is not the default
    for bn, nk in ((32, 4), (32, 3), (16, 8)):  # its other tile / K-ring geometries
        out[f"ws-bn{bn}-nk{nk}"] = C(64, bn, 4, nk, 1, prefetch_idx=False, kernel="gluon_ws")
    tl = default_config(b, shape.heads, shape.d_qk, gluon=False)
    if tl != dflt:
        out["tl"] = tl  # the Triton-only default, where the default now differs
    if shape.heads <= 32:  # the few-heads kernel (heads on wgmma N), the ring depths that fit
        for nbuf in (2, 3):
            cfg = _nh(shape.heads, nbuf)
            d_tail = shape.d_qk - shape.d_v
            kc = dict(D_V=shape.d_v, D_TAIL=d_tail, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
                      BLOCK_T=max(16, 1 << max(d_tail - 1, 0).bit_length()), NBUF=nbuf,
                      MAX_T=1 << (-(-shape.topk // cfg.block_n) - 1).bit_length())  # fmt: skip
            if gluon_nh.smem_bytes(kc) <= SMEM_LIMIT and cfg != dflt:
                out[f"nh-nb{nbuf}"] = cfg
    return out


def fp8_candidates(shape: bsm.Shape, b: int) -> dict:
    """--fp8: label -> (variant, SplitConfig or None = that variant's default): the bf16
    default (the baseline of the FP8 goal), the FP8 default, and the FP8 kernels it is not."""
    from servelab.kernels.sparse_mla.dispatch.defaults import default_config, geometry

    out = {"bf16": ("splitkv", None), "fp8": ("fp8", None)}
    tile = 128 if shape.d_qk == 576 else 64  # bsm.fp8_cache's layouts
    dflt = default_config(b, shape.heads, shape.d_qk, fp8_tile=tile)
    tl = default_config(b, shape.heads, shape.d_qk, fp8_tile=tile, gluon=False)
    if tl != dflt:
        out["fp8-tl"] = ("fp8", tl)
    if dflt.kernel != "gluon_fp8":
        out["fp8-gluon"] = ("fp8", geometry("gluon_fp8"))
    else:  # the other partial dtype (16-bit ones are stored through the staging tile)
        if dflt.partial_dtype == "input":
            out["fp8-p32"] = ("fp8", replace(dflt, partial_dtype="fp32"))
        else:
            out["fp8-p16"] = ("fp8", replace(dflt, partial_dtype="input"))
    if shape.heads <= 32:  # the few-heads kernel on the FP8 cache, its ring depths
        for nbuf in (1, 2, 3):
            if _nh(shape.heads, nbuf, True) != dflt:
                out[f"fp8-nh-nb{nbuf}"] = ("fp8", _nh(shape.heads, nbuf, True))
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out"))
    ap.add_argument("--shapes", default="v4-flash,v3.2,v4-pro,v4-flash-tp2-h32,v3.2-tp8-h16")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--only", default="", help="only these candidate labels (a,b)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--drops", default="", help="B values at which the Gluon default is also "
                    "timed with its gathers or its dots dropped (diagnostics), e.g. 64,128")
    ap.add_argument("--fp8", action="store_true", help="FP8 KV kernels against the bf16 "
                    "default (--drops then also drops the FP8 Gluon kernel's dequantisation)")
    ap.add_argument("--split-costs", action="store_true", help="at B >= 16 also time the "
                    "default with 16-bit partials (p16), a PDL merge (pdl, p16-pdl) and half or "
                    "twice the splits (waves0.5, waves2)")
    ap.add_argument("--wait-file", default="", help="after compiling, wait for this file")
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no cell after this")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, toy shapes")
    args = ap.parse_args(argv)
    log = bsm.Log(args.out)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        bsm.DEVICE, bsm.ROT_CAP = "cpu", 2
        shapes, batches, reps, pool = bsm.SMOKE_SHAPES, [1, 3], 2, 500
    else:
        by_name = {s.name: s for s in bsm.SHAPES}
        unknown = [n for n in args.shapes.split(",") if n not in by_name]
        if unknown:
            ap.error(f"unknown shape(s) {unknown}; choose from {sorted(by_name)}")
        shapes = [by_name[n] for n in args.shapes.split(",")]
        batches = [int(x) for x in args.batches.split(",")]
        reps, pool = args.reps, 1 << 20
    from servelab.kernels.sparse_mla.dispatch.defaults import geometry
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.fp8 import dequantize_kv
    from servelab.kernels.sparse_mla.reference import sparse_mla_decode_reference
    from servelab.kernels.sparse_mla.splitkv.lab import Lab

    dtype = torch.float16 if bsm.DEVICE == "cpu" else torch.bfloat16
    only = set(filter(None, args.only.split(",")))
    t0 = time.time()
    data, caches, jobs = {}, {}, []
    for shape in shapes:
        torch.manual_seed(0)
        data[shape.name] = torch.randn(pool, shape.d_qk, device=bsm.DEVICE).to(dtype)
        if args.fp8:
            caches[shape.name] = bsm.fp8_cache(shape, data[shape.name])
        for b in batches:
            cands = (fp8_candidates(shape, b) if args.fp8 else
                     {k: ("splitkv", c)
                      for k, c in candidates(shape, b, args.split_costs).items()})  # fmt: skip
            for label, (variant, cfg) in cands.items():
                if not only or label in only:
                    jobs.append((shape, b, label, variant, cfg, ""))
            if str(b) not in args.drops.split(","):
                continue
            nh = shape.heads <= 32
            if args.fp8:  # where the FP8 Gluon kernels' time goes (lab diagnostics)
                for drop in ("gather", "dots", "dequant"):
                    jobs.append((shape, b, f"drop-{drop}", "fp8", geometry("gluon_fp8"), drop))
                    if nh:
                        jobs.append((shape, b, f"drop-nh-{drop}", "fp8",
                                     _nh(shape.heads, 2, True), drop))  # fmt: skip
            else:  # where the 16-bit Gluon kernels' time goes
                for drop in ("gather", "dots"):
                    jobs.append((shape, b, f"drop-ws-{drop}", "splitkv", geometry("gluon_ws"),
                                 drop))  # fmt: skip
                    if nh:
                        jobs.append((shape, b, f"drop-nh-{drop}", "splitkv", _nh(shape.heads, 2),
                                     drop))  # fmt: skip
    # Check (and so compile) every cell against the fp32 reference, with padding.
    checks = {}
    for shape, b, label, variant, cfg, drop in jobs:
        if drop:
            checks[(shape.name, b, label)] = {"diagnostic": drop}  # wrong results by design
            continue
        kv = data[shape.name]
        src = caches[shape.name] if variant == "fp8" else kv
        (q, idx), = bsm.make_inputs(shape, max(b, 3), kv, 1, seed=7)  # fmt: skip
        idx[0, ::5] = -1
        idx[1, :] = -1  # all padding: out 0, lse -inf
        scale = shape.d_qk**-0.5
        # Check the config that is timed (the default: the rules at this B; B >= 3 for the
        # padding rows, so the check's rule may differ: the timed cell's record says).
        try:
            run = splitkv_launch(q, src, idx, scale, shape.d_v, config=cfg)
            o, lg = run.out, run.lse
            ref_kv = dequantize_kv(src).to(dtype) if variant == "fp8" else kv
            ref_o, ref_l = sparse_mla_decode_reference(q, ref_kv, idx, scale, shape.d_v)
            rel = ((o.float() - ref_o).norm() / ref_o.norm()).item()
            fin = torch.isfinite(ref_l)
            pad_ok = bool(torch.all(o[1] == 0)) and bool(torch.all(torch.isneginf(lg[1])))
            checks[(shape.name, b, label)] = dict(
                rel_err=rel, lse_err=(lg[fin] - ref_l[fin]).abs().max().item(), pad_ok=pad_ok,
                checked=run.ran.variant)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a config that does not compile is a result
            checks[(shape.name, b, label)] = dict(error=f"{type(e).__name__}: {str(e)[:160]}")
        log.say(f"check {shape.name} B={b} {label}: {checks[(shape.name, b, label)]}")
    if bsm.DEVICE == "cuda":
        torch.cuda.synchronize()
    log.say(f"checked {len(jobs)} cells in {time.time() - t0:.0f} s")
    bsm.wait_for_file(log, args.wait_file, t0)
    res = {}
    for shape, b, label, variant, cfg, drop in jobs:
        chk = checks[(shape.name, b, label)]
        if "error" in chk or (not drop and not (chk["rel_err"] <= MAX_REL_ERR and chk["pad_ok"])):
            log.say(f"not timed (failed its check): {shape.name} B={b} {label}: {chk}")
            continue
        if time.time() - t0 > args.budget_s:
            log.say(f"time budget spent: skipping {shape.name} B={b} {label}")
            continue
        rec = bsm.run_cell(log, shape, b, data[shape.name], variant, reps, 128, cfg=cfg,
                           lab=Lab(drop=drop) if drop else None, label=label,
                           cache=caches.get(shape.name))  # fmt: skip
        rec.update(checks[(shape.name, b, label)])
        res[(shape.name, b, label)] = rec
        log.say(f"{shape.name} B={b} {label}: {rec.get('us', float('nan')):.2f} us "
                f"[{rec.get('num_splits')}] regs={rec.get('split_regs')} "
                f"spills={rec.get('split_spills')} smem={rec.get('split_smem')}")  # fmt: skip
    nan = float("nan")
    first = "bf16" if args.fp8 else "default"
    labels = sorted({k[2] for k in res}, key=lambda x: (x != first, x))
    log.say(f"\nelapsed {time.time() - t0:.0f} s; us per call (median) [splits], %floor of "
            "the best; * = best")
    log.say(f"{'shape':17} {'B':>4} " + " ".join(f"{x:>14}" for x in labels)
            + f" {'%floor':>7} {'x ' + first:>9}")
    for shape in shapes:
        for b in batches:
            row = {x: res.get((shape.name, b, x), {}) for x in labels}
            if not any(row.values()):
                continue
            best = min((x for x in labels if not x.startswith("drop-")),
                       key=lambda x: row[x].get("us", float("inf")))  # diagnostics are not results
            cells = [f"{row[x].get('us', nan):7.2f}{'*' if x == best else ' '}"
                     f"[{row[x].get('num_splits', 0):>3}]" for x in labels]  # fmt: skip
            d = row.get(first, {}).get("us", nan)
            log.say(f"{shape.name:17} {b:>4} " + " ".join(f"{c:>14}" for c in cells)
                    + f" {row[best].get('pct_floor', nan):>7.1f}"
                    f" {d / row[best].get('us', nan):>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
