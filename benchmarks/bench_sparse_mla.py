"""Sparse MLA decode on one GPU: torch eager vs the (B, H) Triton fallback vs split-KV.

One invocation does everything and prints a compact table last:
  1. a correctness check per shape (bf16, B=3, vs the fp32 reference),
  2. optionally (--sweep) a sweep of split-kernel configs at B in {1, 8, 64},
  3. the timing table per shape and batch for eager / naive / splitkv,
  4. the compiler's report of the split kernel (registers, spills, async copies, wgmma).
Full results go to OUT/bench_sparse_mla.jsonl and OUT/bench_sparse_mla.log.
--compare instead times the merge variants at B <= 8 (two kernels, PDL) and the two Triton
FP8 kernels against bf16, compiling all cells first; --wait-file lets GPU tests run during
that compile phase and holds the timing until they are done.

Timing, inputs and the roofline ceilings: sparse_mla_common.py (tune/timing.py's CUDA-graph
timer; the H200 preset's measured copy rate and bf16 matmul rate). The table's rows feed
docs/performance.md (benchmarks/perf_tables.py checks them against this script's JSONL).

    PYTHONPATH=src python3 benchmarks/bench_sparse_mla.py --out $OUT [--quick] [--sweep]
    PYTHONPATH=src python3 benchmarks/bench_sparse_mla.py --compare --out $OUT [--wait-file F]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import sparse_mla_common as common
import torch
from sparse_mla_common import (
    BATCHES,
    SHAPES,
    SMOKE_SHAPES,
    Log,
    Shape,
    ceilings,
    check_correct,
    fp8_cache,
    run_cell,
)


def sweep_configs(shape: Shape):
    """The split-kernel search space, as data: geometry x index prefetch."""
    from servelab.kernels.sparse_mla.splitkv.geometry import SplitConfig as C

    if shape.heads >= 64:
        yield from (
            C(64, 64, 8, 2, 1), C(64, 64, 8, 2, 1, prefetch_idx=False), C(64, 128, 8, 1, 1),
            C(64, 32, 8, 3, 1), C(32, 64, 4, 2, 1), C(16, 32, 4, 2, 2),
            C(16, 32, 4, 2, 2, prefetch_idx=False),
        )  # fmt: skip
    else:
        yield from (
            C(16, 64, 4, 2, 1), C(16, 64, 4, 2, 1, prefetch_idx=False), C(16, 128, 4, 1, 1),
            C(16, 32, 4, 2, 2), C(16, 32, 4, 3, 2), C(32, 32, 4, 2, 1),
        )  # fmt: skip


def ir_report(log: Log, out: Path, tag: str, compiled: dict) -> None:
    """What the compiler made of the latest split kernel: async copies, wgmma vs mma.sync,
    vector width of global loads; the TTGIR goes to OUT for reading."""
    k = compiled.get("split")
    info = common.compiled_info("split", compiled)
    asm = getattr(k, "asm", {}) or {}
    ptx, ttgir = asm.get("ptx", ""), asm.get("ttgir", "")
    counts = {
        pat: ptx.count(pat)
        for pat in ("cp.async.cg", "cp.async.ca", "cp.async.bulk", "wgmma.mma_async", "mma.sync",
                    "ld.global.v4", "ld.global.nc.v4", "ld.global", "st.global", "bar.sync")
    }  # fmt: skip
    counts["ttgir_async_copy"] = ttgir.count("async_copy_global_to_local")
    counts["ttgir_warp_group_dot"] = ttgir.count("warp_group_dot")
    log.say(f"ir {tag}: regs={info.get('split_regs')} spills={info.get('split_spills')} "
            f"smem={info.get('split_smem')} {counts}")
    if ttgir and not (out / "split_kernel.ttgir").exists():
        (out / "split_kernel.ttgir").write_text(ttgir)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out"))
    ap.add_argument("--quick", action="store_true", help="fewer batches and replays")
    ap.add_argument("--sweep", action="store_true", help="sweep split-kernel configs first")
    ap.add_argument("--shapes", default=",".join(s.name for s in SHAPES))
    ap.add_argument("--no-eager", action="store_true")
    ap.add_argument("--sweep-only", action="store_true", help="sweep, then no timing table")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, toy shapes")
    ap.add_argument("--compare", action="store_true",
                    help="merge variants at B <= 8 and FP8 old/new vs bf16 (issue 5 follow-up)")
    ap.add_argument("--only", default="",
                    help="--compare: only cells whose label starts with one of these (a,b)")
    ap.add_argument("--wait-file", default="",
                    help="--compare: after compiling, wait for this file before timing")  # fmt: skip
    ap.add_argument("--budget-s", type=float, default=1e9,
                    help="start no new shape or sweep once this much time has passed")  # fmt: skip
    args = ap.parse_args(argv)
    log = Log(args.out)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported
        common.DEVICE, common.ROT_CAP = "cpu", 2
        shapes, batches, reps, pool = SMOKE_SHAPES, [1, 3], 2, 500
        if args.sweep:  # toy sizes cannot compile the real sweep's 64-head tiles quickly
            args.sweep = False
        name = "cpu (TRITON_INTERPRET)"
    else:
        props = torch.cuda.get_device_properties(0)
        name = f"{props.name} sms={props.multi_processor_count}"
        by_name = {s.name: s for s in SHAPES}
        shapes = [by_name[n] for n in args.shapes.split(",")]  # in the order asked
        batches = [1, 64] if args.quick else BATCHES
        reps, pool = (15 if args.quick else 40), 1 << 20
    import triton

    bw, fl, src = ceilings()
    log.say(f"device {name} torch {torch.__version__} triton {triton.__version__} "
            f"date {time.strftime('%Y-%m-%d %H:%M:%S')}; roofline ceilings "
            f"{bw / 1e12:.2f} TB/s, {fl / 1e12:.0f} TFLOP/s bf16 ({src})")  # fmt: skip
    if args.compare:
        from bench_sparse_mla_compare import compare

        compare(log, args, shapes, 2 if args.smoke else 30, pool)
        return 0
    t0 = time.time()
    table = []
    for shape in shapes:
        if time.time() - t0 > args.budget_s:
            log.say(f"time budget spent: skipping {shape.name}")
            continue
        torch.manual_seed(0)
        # A 2^20-row pool (1.1-1.2 GB): random rows, far beyond L2. fp16 in smoke mode
        # (bf16 dots are wrong in the interpreter).
        dtype = torch.float16 if common.DEVICE == "cpu" else torch.bfloat16
        kv = torch.randn(pool, shape.d_qk, device=common.DEVICE).to(dtype)
        cache = fp8_cache(shape, kv)
        log.row({"check": check_correct(log, shape, kv, cache)})
        if args.sweep:
            for b in (1, 8, 64):
                best = None
                for cfg in sweep_configs(shape):
                    rec = run_cell(log, shape, b, kv, "splitkv", reps, 128, cfg=cfg)
                    if "error" in rec:
                        log.say(f"sweep {shape.name} B={b} {cfg}: {rec['error']}")
                        continue
                    log.say(f"sweep {shape.name} B={b} bh{cfg.block_h} bn{cfg.block_n} "
                            f"w{cfg.num_warps} s{cfg.num_stages} c{cfg.ctas_per_sm} "
                            f"pf{int(cfg.prefetch_idx)} "
                            f"splits={rec['num_splits']}: {rec['us']:.2f} us "
                            f"regs={rec.get('split_regs')} spills={rec.get('split_spills')}")  # fmt: skip
                    if best is None or rec["us"] < best[0]:
                        best = (rec["us"], cfg)
                log.say(f"BEST {shape.name} B={b}: {best}")
        if args.sweep_only:
            continue
        for b in batches:
            cells = {}
            for v in ("eager", "naive", "splitkv", "fp8"):
                if v == "eager" and args.no_eager:
                    continue
                slow = v in ("eager", "naive")
                cells[v] = run_cell(log, shape, b, kv, v, 6 if slow else reps, 128, cache=cache)
                if v == "splitkv" and b in (1, 64):
                    ir_report(log, args.out, f"{shape.name} B={b}",
                              cells[v].pop("_compiled", {}))  # fmt: skip
            table.append((shape, b, cells))
            s = cells["splitkv"]
            log.say(f"{shape.name} B={b}: " + " ".join(
                f"{k}={c.get('us', float('nan')):.1f}us" for k, c in cells.items()))  # fmt: skip
            if "error" in s:
                log.say(f"  splitkv error: {s['error']}")
        del kv, cache
        if common.DEVICE == "cuda":
            torch.cuda.empty_cache()
    log.say(f"\nelapsed {time.time() - t0:.0f} s\n")
    hdr = (f"{'shape':17} {'B':>4} {'eager':>8} {'naive':>8} {'split':>7} {'S':>3} "
           f"{'TFLOP/s':>7} {'TB/s':>5} {'%floor':>6} {'x naive':>7} {'x eager':>7} "
           f"{'fp8':>7} {'fp8 %fl':>7} {'x bf16':>6} {'regs':>4}")  # fmt: skip
    log.say("us per call (median); splitkv = bf16 split-KV; fp8 = the default FP8 kernel, FP8 KV")
    log.say(hdr)
    nan = float("nan")
    for shape, b, cells in table:
        e, n, s, f = (cells.get(k, {}) for k in ("eager", "naive", "splitkv", "fp8"))
        su, fu = s.get("us", nan), f.get("us", nan)
        log.say(
            f"{shape.name:17} {b:>4} {e.get('us', nan):>8.1f} {n.get('us', nan):>8.1f} "
            f"{su:>7.2f} {s.get('num_splits', 0):>3} {s.get('tflops', nan):>7.1f} "
            f"{s.get('tbs', nan):>5.2f} {s.get('pct_floor', nan):>6.1f} "
            f"{n.get('us', nan) / su:>7.1f} {e.get('us', nan) / su:>7.1f} {fu:>7.2f} "
            f"{f.get('pct_floor', nan):>7.1f} {su / fu:>6.2f} {s.get('split_regs')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
