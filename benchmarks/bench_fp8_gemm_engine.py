"""SGLang's own block-FP8 GEMM with servelab-tuned configs vs the same kernel with SGLang's
shipped configs (or its default where none ships), on the GPU at hand, in one call:

  1. check: the engine's launcher against the fp64 reference for a few configs, split-K and
     swapped A/B included (a wrong kernel would make every timing meaningless);
  2. tune: servelab.tune.engine_tune on the engine's kernel, the shipped config a candidate
     of every point, within --tune-s seconds; the files are written in SGLang's format with
     a side file naming the kernel they were tuned on (OUT/configs/);
  3. compare: per point, the config SGLang's own lookup (get_w8a8_block_fp8_configs, nearest
     M) returns from its shipped folder, then after `servelab tune install` put the tuned
     files there (backing up the shipped ones; restored at the end, and checked), timed in
     six passes, order reversed each pass (ABBAAB), with the tuner's method (CUDA-graph
     replay, inputs rotated past L2), medians compared; "=" in the table marks points where both
     lookups give the same config (the same launch: the ratio there is the timing noise);
     a short table last.

Where SGLang's runtime dependencies are absent (a GPU box with the wheel only), the kernel
file is loaded with its host helpers supplied (kernels/fp8_gemm/engine.py); the label says so.
`--engine vllm` does the same with vLLM's launcher, lookup and shipped folder (where `vllm`
does not import, its kernel, launcher and lookup run from its own file: vllm_source.py); the
check then skips SPLIT_K / SWAP_AB, which vLLM's kernel does not read.

  PYTHONPATH=src:/path/to/sglang-wheel-dir python3 benchmarks/bench_fp8_gemm_engine.py OUT \
      [--tune-s 330] [--workers 15] [--shapes 1024,4096 ...] [--batch-sizes 1,16,...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROUNDS = 6          # passes per point in the comparison, order reversed each pass (ABBA)
SHAPES = ((1024, 4096), (1536, 4096), (4096, 2048), (4096, 512), (8192, 1024), (7168, 18432),
          (18432, 7168))


def check(ek) -> int:
    """Bad outputs of the engine's launcher against the fp64 reference (0: all within bound)."""
    import torch

    from servelab.kernels.fp8_gemm import reference as R
    torch.manual_seed(0)
    cfgs = [dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=32,
                 num_warps=4, num_stages=3),
            dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1,
                 num_warps=4, num_stages=4, SPLIT_K=4),
            dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=1,
                 num_warps=4, num_stages=4, SWAP_AB=True),
            dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1,
                 num_warps=4, num_stages=4, SWAP_AB=True, SPLIT_K=2)]
    # only the keys this launcher reads (vLLM's kernel takes no SPLIT_K / SWAP_AB)
    cfgs = [c for c in cfgs if not set(c) - {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K",
                                             "GROUP_SIZE_M", "num_warps", "num_stages"}
            - ek.extra_keys]
    cfgs.append(dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=128, GROUP_SIZE_M=1,
                     num_warps=4, num_stages=5))
    bad = 0
    for m, n, k in [(1, 4096, 512), (24, 1024, 4096), (300, 1536, 4096)]:
        x = torch.randn(m, k, device="cuda")
        w = torch.randn(n, k, device="cuda") * 0.05
        aq, as_ = R.quantize_per_token_group(x)
        bq, bs = R.quantize_weight_per_block(w)
        ref = R.w8a8_block_matmul(aq, as_, bq, bs)
        bound = 2.0 ** -8 * ref.abs() + 2.0 ** -7 * R.abs_matmul(aq, as_, bq, bs)
        for cfg in cfgs:
            out = ek.launch(aq, as_, bq, bs, cfg)
            nbad = int(((out.double() - ref).abs() > bound).sum()) + int(out.isnan().sum())
            bad += nbad > 0
            print(f"check M={m} N={n} K={k} {sorted(cfg.items())}: outside bound {nbad}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--engine", default="sglang", choices=("sglang", "vllm"))
    ap.add_argument("--tune-s", type=float, default=330.0)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 4))
    ap.add_argument("--shapes", nargs="*", default=None, help="N,K pairs")
    ap.add_argument("--batch-sizes", default=None, help="comma-separated M values")
    ap.add_argument("--margin", type=float, default=0.015)
    args = ap.parse_args()

    import torch

    from servelab.kernels.fp8_gemm import configs, engine, formats
    from servelab.kernels.fp8_gemm import reference as R
    from servelab.tune import engine_lookup, engine_tune, install, search
    from servelab.tune.space import DEFAULT_BATCH_SIZES, Config
    from servelab.tune.timing import Problem, warm_up_gpu

    t_start = time.time()
    shapes = ([tuple(int(v) for v in s.split(",")) for s in args.shapes] if args.shapes
              else list(SHAPES))
    ms = ([int(v) for v in args.batch_sizes.split(",")] if args.batch_sizes
          else list(DEFAULT_BATCH_SIZES))
    args.out.mkdir(parents=True, exist_ok=True)
    ek = engine.load(args.engine)
    dev = torch.cuda.get_device_name()
    print(f"kernel: {ek.label}\ndevice: {dev}, torch {torch.__version__}")
    bad = check(ek)
    if bad:
        print(f"FAIL: {bad} config/shape pairs outside the bound; not timing a wrong kernel")
        return 1

    def shipped(p: engine_tune.Point) -> tuple[Config, str]:
        entries = ek.shipped(p.n, p.k, dev)
        if entries:
            return Config.from_engine(configs.nearest(entries, p.m)), "file"
        return Config.from_engine(configs.default_config(args.engine)), "default"

    # smallest M first: where the configs matter most and timings are cheapest; a deadline
    # cuts the largest, which then keep the shipped config
    points = sorted((engine_tune.Point(n, k, m) for n, k in shapes for m in ms),
                    key=lambda p: (p.m, p.n * p.k))
    warm_up_gpu()
    res = engine_tune.tune(ek, points, shipped, args.tune_s, args.workers, args.margin)
    t_tuned = time.time()

    cfg_dir = args.out / "configs"
    cfg_dir.mkdir(exist_ok=True)
    for n, k in shapes:
        rows = {r.point.m: r for r in res if (r.point.n, r.point.k) == (n, k)}
        formats.merge_write_config(cfg_dir / formats.config_file_name(args.engine, n, k, dev),
                                   {m: r.best.as_engine() for m, r in rows.items()})
        formats.merge_write_side(cfg_dir / formats.side_file_name(n, k, dev), {
            "tool": "benchmarks/bench_fp8_gemm_engine.py", "kernel": ek.label,
            "device_name": dev, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "timing_method": "median over CUDA-graph replays, inputs rotated past L2",
            "margin_vs_shipped": args.margin, "N": n, "K": k},
            {m: {"config": r.best.as_engine(), "time_us": r.best_us, "shipped_us": r.shipped_us,
                 "shipped": r.shipped.as_engine(), "shipped_source": r.shipped_source,
                 "timed": r.timed, "failed": r.failed, "errors": r.errors}
             for m, r in rows.items()})

    # compare: the configs the ENGINE'S OWN lookup returns (its get_w8a8_block_fp8_configs,
    # nearest M as its launcher takes it) before and after `servelab tune install`
    folder = engine.config_dir(args.engine)
    own = ek.module._servelab_lookup
    default = configs.default_config(args.engine)

    def lookup(n: int, k: int, bn: int, bk: int):
        # the engine's function under torch's device name: vLLM imported without its compiled
        # ops cannot name the GPU itself (its platform is then "unspecified")
        with engine_lookup.device_named(ek, dev):
            own.cache_clear()
            return own(n, k, bn, bk)
    lookup.cache_clear = own.cache_clear

    def engine_pick(n: int, k: int, m: int) -> Config:
        found = lookup(n, k, 128, 128)
        return Config.from_engine(configs.nearest(found, m) if found else default)

    before = {(n, k): lookup(n, k, 128, 128) for n, k in shapes}
    picks_shipped = {(r.point.n, r.point.k, r.point.m): engine_pick(r.point.n, r.point.k, r.point.m)
                     for r in res}
    installed = install.install(cfg_dir, args.engine, folder)
    lookup.cache_clear()
    found_all = all(lookup(n, k, 128, 128) == formats.read_config_file(
        cfg_dir / formats.config_file_name(args.engine, n, k, dev)) for n, k in shapes)
    print(f"installed {len(installed)} files into {folder} "
          f"({sum(f.replaced for f in installed)} replaced shipped ones); the engine's lookup "
          f"returns every tuned file: {found_all}")
    picks_tuned = {key: engine_pick(*key) for key in picks_shipped}
    table = []
    for r in sorted(res, key=lambda r: (r.point.n, r.point.k, r.point.m)):
        p = r.point
        key = (p.n, p.k, p.m)
        tuned, shipped_cfg = picks_tuned[key], picks_shipped[key]
        prob = Problem(p.n, p.k, p.m, "cuda", seed=7 * p.m + p.n + p.k + 1, kernel=ek)
        tu, su = engine_tune.alternate(prob, [tuned, shipped_cfg], search.HIGH_REPS, ROUNDS)
        del prob
        torch.cuda.empty_cache()
        table.append({"n": p.n, "k": p.k, "m": p.m, "shipped": shipped_cfg.key,
                      "same": tuned == shipped_cfg,
                      "shipped_source": r.shipped_source, "tuned": tuned.key,
                      "shipped_us": su, "tuned_us": tu,
                      "speedup": (su / tu) if su and tu else None,
                      "tuned_tflops": R.flops(p.m, p.n, p.k) / (tu * 1e-6) / 1e12 if tu else None})
    restored = install.restore(folder)
    lookup.cache_clear()
    back = all(lookup(n, k, 128, 128) == before[(n, k)] for n, k in shapes)
    print(f"restored {len(restored)} files; the engine's lookup is back to what it ships: {back}")
    (args.out / "compare.json").write_text(json.dumps(
        {"kernel": ek.label, "device": dev, "rows": table, "engine_found_tuned": found_all,
         "restored": back, "rounds": ROUNDS,
         "tune_s": t_tuned - t_start, "compare_s": time.time() - t_tuned}, indent=1))

    sp = [row["speedup"] for row in table if row["speedup"]]
    geo = math.exp(sum(map(math.log, sp)) / len(sp)) if sp else float("nan")
    slow = [row for row in table if row["speedup"] and row["speedup"] < 0.98]
    print(f"\n{'N':>6} {'K':>6} {'M':>5} {'shipped':>26} {'tuned':>26} {'ship_us':>8} "
          f"{'tuned_us':>8} {'x':>6} {'TF/s':>6}")
    for row in table:
        print(f"{row['n']:6d} {row['k']:6d} {row['m']:5d} "
              f"{row['shipped'] + ('' if row['shipped_source'] == 'file' else '*'):>26} "
              f"{('= ' if row['same'] else '') + row['tuned']:>26} {row['shipped_us'] or float('nan'):8.2f} "
              f"{row['tuned_us'] or float('nan'):8.2f} {row['speedup'] or float('nan'):6.3f} "
              f"{row['tuned_tflops'] or float('nan'):6.1f}")
    small = [row["speedup"] for row in table if row["speedup"] and row["m"] <= 64]
    geo_small = math.exp(sum(map(math.log, small)) / len(small)) if small else float("nan")
    print(f"(* = {args.engine}'s default config: no shipped file for the shape on {dev})")
    print(f"points {len(table)}, geomean speedup {geo:.3f}x (M<=64: {geo_small:.3f}x), "
          f"min {min(sp) if sp else float('nan'):.3f}x, slower than 0.98x: {len(slow)} "
          f"{[(r['n'], r['k'], r['m'], round(r['speedup'], 3)) for r in slow]}; "
          f"tune {t_tuned - t_start:.0f} s, compare {time.time() - t_tuned:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
