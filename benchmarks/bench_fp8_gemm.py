"""Block-FP8 GEMM on a GPU: correctness, tuner quality (fast vs exhaustive), and ceilings.

Subcommands (each prints a table; numbers in hardware units):
  check                      GPU correctness vs the fp64 reference; geometry-only bit identity;
                             compile-ahead check (pool compile, then a cache hit here)
  tune ARGS...               `servelab tune ...` through the verb module alone
  compare FAST_DIR EXH_DIR   fast picks vs the exhaustive optimum, from the two checkpoints
  ceilings DIR               tuned kernel vs torch._scaled_mm (per-tensor, cuBLAS) and HBM
  all OUT [SECONDS]          the device plan: every step above under one time budget, logs in OUT
  multi OUT [SECONDS]        the two-GPU plan (run_multi): one vs two GPUs, cold and warm
                             Triton cache; exhaustive subset on both GPUs; compare; ceilings
  multi-lean OUT [SECONDS]   multi's four fast runs only (no check)
  scaling OUT                wall time of multi's four fast runs, from their logs and checkpoints
Usage on the device: PYTHONPATH=src python3 benchmarks/bench_fp8_gemm.py check
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def _rel(x, ref) -> float:
    return float((x.double() - ref).norm() / ref.norm())


def check() -> int:
    import torch

    from servelab.kernels.fp8_gemm import kernel as K
    from servelab.kernels.fp8_gemm import reference as R
    from servelab.tune.compile import Precompiler
    from servelab.tune.space import Config
    dev = "cuda"
    torch.manual_seed(0)
    bad = 0
    # quantization: bit-exact against torch's fp8 cast
    for m, k in [(1, 128), (37, 4096), (256, 200)]:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16) * 3
        q, s = K.per_token_group_quant(x)
        rq, rs = R.quantize_per_token_group(x)
        ok = torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
        bad += not ok
        print(f"quant M={m} K={k}: {'bit-exact' if ok else 'MISMATCH'}")
    cfgs = [dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=3),
            dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=32, num_warps=4, num_stages=3),
            dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, BLOCK_SIZE_K=128, GROUP_SIZE_M=16, num_warps=8, num_stages=3),
            dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=4)]
    print("GEMM vs fp64 reference: elementwise bound |err| <= 2^-8|ref| + 2^-7 * sum|a b| (bf16 out,"
          " Hopper fp8 MMA ~14-bit adds within a K step); relative Frobenius error printed")
    for m, n, k in [(1, 4096, 512), (100, 1024, 4096), (333, 200, 200), (4096, 1536, 4096)]:
        x = torch.randn(m, k, device=dev)
        w = torch.randn(n, k, device=dev) * 0.05
        aq, as_ = R.quantize_per_token_group(x)
        bq, bs = R.quantize_weight_per_block(w)
        ref = R.w8a8_block_matmul(aq, as_, bq, bs)
        absref = R.abs_matmul(aq, as_, bq, bs)
        outs = []
        for cfg in cfgs:
            out = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
            K.w8a8_block_fp8_matmul(aq, as_, bq, bs, cfg, out=out)
            err = (out.double() - ref).abs()
            bound = 2.0 ** -8 * ref.abs() + 2.0 ** -7 * absref
            nbad = int((err > bound).sum()) + int(out.isnan().sum())
            rel = _rel(out, ref)
            bad += nbad > 0 or rel > 2 ** -7
            outs.append((cfg, out))
            print(f"  M={m:5d} N={n:5d} K={k:5d} {Config.from_engine(cfg).key:22s} rel={rel:.2e} "
                  f"outside-bound={nbad}")
        same = [torch.equal(outs[0][1], o) for _, o in outs[1:]]
        print(f"  bit-identical to config 0 (BK=128 ones share the K order): {same}")
    # compile-ahead: compile 8 configs in a pool, then load them here from the cache
    pc = Precompiler("cuda", None, 8)
    extra = [Config(bm, bn, 128, 1, w, s) for bm in (16, 64) for bn in (64, 128) for w, s in ((4, 4), (8, 5))]
    t0 = time.perf_counter()
    errs = pc.ensure(extra)
    t1 = time.perf_counter()
    aq, as_ = R.quantize_per_token_group(torch.randn(64, 4096, device=dev))
    bq, bs = R.quantize_weight_per_block(torch.randn(1024, 4096, device=dev))
    t2 = time.perf_counter()
    for c in extra:
        K.w8a8_block_fp8_matmul(aq, as_, bq, bs, c.as_engine())
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    pc.close()
    print(f"compile-ahead: {len(extra)} configs in {t1 - t0:.1f} s on 8 processes ({len(errs)} failed); "
          f"first launches here afterwards {1e3 * (t3 - t2) / len(extra):.0f} ms each (cache hits)")
    print(f"CHECK {'PASS' if bad == 0 else f'FAIL ({bad})'}")
    return 0 if bad == 0 else 1


def tune(args: list[str]) -> int:
    import typer

    from servelab.cli import tune as T
    from servelab.errors import UserError
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    T.register(app)
    try:
        app(args=["tune", *args], standalone_mode=False)
    except UserError as exc:
        print(f"error: {exc}")
        return 2
    return 0


def _records(d: Path):
    from servelab.tune.checkpoint import FILE_NAME, read_records
    return [r for r in read_records(d / FILE_NAME) if r]


def compare(fast_dir: Path, exh_dir: Path) -> int:
    """For each exhaustive point: time of the fast pick (in the exhaustive run) / exhaustive best."""
    fast = {(r["n"], r["k"], r["m"]): r for r in _records(fast_dir) if r["t"] == "unit"}
    exh = _records(exh_dir)
    exh_units = {(r["n"], r["k"], r["m"]): r for r in exh if r["t"] == "unit"}
    meas: dict = {}
    for r in exh:
        if r["t"] == "m" and r["us"] is not None:
            meas[(r["n"], r["k"], r["m"], r["cfg_key"])] = r["us"]
    from servelab.tune.space import Config
    rows, within = [], 0
    print(f"{'N':>6} {'K':>6} {'M':>5} {'exh_best_us':>11} {'fast_pick_us':>12} {'ratio':>6} "
          f"{'timed':>9} {'frac':>5}")
    for key in sorted(exh_units):
        if key not in fast:
            continue
        e, f = exh_units[key], fast[key]
        t_pick = meas.get((*key, Config.from_engine(f["best"]).key))
        ratio = t_pick / e["us"] if t_pick and e["us"] else None
        within += ratio is not None and ratio <= 1.03
        frac = f["timed"] / max(1, e["candidates"])
        rows.append({"n": key[0], "k": key[1], "m": key[2], "exh_us": e["us"], "fast_pick_us": t_pick,
                     "ratio": ratio, "fast_timed": f["timed"], "candidates": e["candidates"],
                     "frac": frac})
        print(f"{key[0]:>6} {key[1]:>6} {key[2]:>5} {e['us']:>11.2f} "
              f"{t_pick if t_pick else float('nan'):>12.2f} {ratio if ratio else float('nan'):>6.3f} "
              f"{f['timed']:>4}/{e['candidates']:<4} {frac:>5.2f}")
    n = len(rows)
    fr = [r["frac"] for r in rows]
    print(f"fast within 3% of exhaustive: {within}/{n} points; configs timed by fast: "
          f"mean {sum(fr) / max(1, n):.1%}, max {max(fr, default=float('nan')):.1%} of the candidates")
    (exh_dir / "compare.json").write_text(json.dumps(rows, indent=1))
    return 0


def _scaled_mm_us(m: int, n: int, k: int) -> float:
    """Median per-call time of torch._scaled_mm per-tensor fp8 (cuBLAS), inputs rotated."""
    import torch

    from servelab.tune.timing import cuda_time_us
    dev = "cuda"
    sets = [((torch.randn(m, k, device=dev) * 0.5).to(torch.float8_e4m3fn),
             (torch.randn(n, k, device=dev) * 0.5).to(torch.float8_e4m3fn)) for _ in range(4)]
    one = torch.ones((), device=dev)
    i = [0]

    def launch() -> None:
        a, b = sets[i[0] % len(sets)]
        i[0] += 1
        torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    ts = sorted(cuda_time_us(launch, 7))
    return ts[len(ts) // 2]


def ceilings(big_dir: Path) -> int:
    """Tuned kernel (from big_dir's side files) vs torch._scaled_mm per-tensor and vs HBM."""

    from servelab.kernels.fp8_gemm import reference as R
    from servelab.tune.timing import copy_rate_tbs
    copy_tbs = copy_rate_tbs()
    print(f"device-to-device copy: {copy_tbs:.2f} TB/s (read+write)")
    rows = []
    for side in sorted(big_dir.glob("*.servelab.json")):
        doc = json.loads(side.read_text())
        n, k = doc["N"], doc["K"]
        for m_s, p in doc["points"].items():
            m = int(m_s)
            cub = _scaled_mm_us(m, n, k)
            ours = p["time_us"]
            fl = R.flops(m, n, k)
            row = {"n": n, "k": k, "m": m, "ours_us": ours, "cublas_us": cub,
                   "ours_tflops": fl / ours / 1e6, "cublas_tflops": fl / cub / 1e6,
                   "ratio": cub / ours, "weight_tbs": R.weight_bytes(n, k) / ours / 1e6,
                   "config": p["config"]}
            rows.append(row)
    print(f"{'N':>6} {'K':>6} {'M':>5} {'ours_us':>8} {'cuBLAS_us':>9} {'ours_TF':>8} {'cuBLAS_TF':>9} "
          f"{'%cuBLAS':>7} {'W_TB/s':>7} {'%4.8TB/s':>8}")
    for r in sorted(rows, key=lambda r: (r["n"], r["m"])):
        print(f"{r['n']:>6} {r['k']:>6} {r['m']:>5} {r['ours_us']:>8.1f} {r['cublas_us']:>9.1f} "
              f"{r['ours_tflops']:>8.1f} {r['cublas_tflops']:>9.1f} {100 * r['ratio']:>6.1f}% "
              f"{r['weight_tbs']:>7.2f} {100 * r['weight_tbs'] / 4.8:>7.1f}%")
    (big_dir / "ceilings.json").write_text(json.dumps({"copy_tbs": copy_tbs, "rows": rows}, indent=1))
    return 0


SHAPES = ["1024,4096", "1536,4096", "4096,2048", "4096,512", "8192,1024"]   # docs/FIELD.md's five
BIG = ["7168,18432", "18432,7168"]


def _run_plan(out: Path, budget_s: float, plan: list) -> int:
    """Run (name, argv, limit_s[, extra_env]) steps in order, each under its own deadline and
    the whole plan's budget, so a slow step cannot starve the rest; logs in OUT/<name>.log."""
    import subprocess
    out.mkdir(parents=True, exist_ok=True)
    t_end = time.time() + budget_s
    summary = []
    for name, cmd, limit, *extra in plan:
        left = t_end - time.time() - (25 if name != "compare" else 0)
        limit = min(limit, left)
        if limit < 10:
            summary.append(f"{name}: NOT RUN (time budget spent)")
            continue
        env = {**os.environ, **(extra[0] if extra else {})}
        t0 = time.time()
        with open(out / f"{name}.log", "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=env)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)      # the step's workers and compile pool too
                proc.wait()
                rc = "timeout"
        summary.append(f"{name}: rc={rc} in {time.time() - t0:.1f} s (limit {limit:.0f} s)")
        print(summary[-1], flush=True)
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    print("\n".join(summary))
    return 0


def _shape_args(shapes: list[str]) -> list[str]:
    return sum((["--shape", s] for s in shapes), [])


def run_all(out: Path, budget_s: float) -> int:
    """check; fast tune 5 shapes x 18 M; verify; big shapes + ceilings; exhaustive subset;
    compare."""
    me = [sys.executable, __file__]
    return _run_plan(out, budget_s, [
        ("check", [*me, "check"], 60),
        ("fast", [*me, "tune", "fp8-gemm", *_shape_args(SHAPES), "--search", "fast",
                  "--out", str(out / "fast"), "--name", "fast"], 240),
        ("verify", [*me, "tune", "verify", str(out / "fast")], 60),
        ("big", [*me, "tune", "fp8-gemm", *_shape_args(BIG), "--batch-sizes", "16,64,1024,4096",
                 "--budget", "0.05", "--out", str(out / "big"), "--name", "big"], 55),
        ("ceilings", [*me, "ceilings", str(out / "big")], 35),
        ("exhaustive", [*me, "tune", "fp8-gemm", *_shape_args(SHAPES), "--search", "exhaustive",
                        "--batch-sizes", "1,64,1024", "--out", str(out / "exh"), "--name", "exh"],
         10_000),
        ("compare", [*me, "compare", str(out / "fast"), str(out / "exh")], 20),
    ])


EXH_M = "1,16,64,256,1024,4096"


def run_multi(out: Path, budget_s: float, lean: bool = False) -> int:
    """The two-GPU plan: the same fast job (5 shapes x 18 M) on GPU 0 and on GPUs 0,1, each
    first with an empty Triton cache (cold: compiles every config it times) and then again
    with that cache warm (a later tune on the machine: only timing left); then an exhaustive
    run on both GPUs at six batch sizes per shape, the fast picks compared with its optimum;
    the engine-space optimum of the two large shapes at small M against cuBLAS and HBM."""
    me = [sys.executable, __file__]
    import tempfile
    tmp = Path(tempfile.mkdtemp(prefix="servelab-triton-"))   # caches stay out of OUT (size)
    c0, c1, c2 = ({"TRITON_CACHE_DIR": str(tmp / t)} for t in ("check", "1gpu", "2gpu"))

    def fast(tag: str, gpus: str, env: dict) -> tuple:
        return (tag, [*me, "tune", "fp8-gemm", *_shape_args(SHAPES), "--search", "fast",
                      "--gpus", gpus, "--out", str(out / tag), "--name", tag], 170, env)
    runs = [("check", [*me, "check"], 45, c0),
            fast("fast1-cold", "0", c1),
            fast("fast2-cold", "0,1", c2),
            fast("fast1-warm", "0", c1),
            fast("fast2-warm", "0,1", c2)]
    if lean:                     # `multi-lean`: the one-vs-two-GPU runs only
        return _run_plan(out, budget_s, [*runs[1:], ("scaling", [*me, "scaling", str(out)], 10)])
    return _run_plan(out, budget_s, [
        *runs,
        ("exh", [*me, "tune", "fp8-gemm", *_shape_args(SHAPES), "--search", "exhaustive",
                 "--gpus", "0,1", "--batch-sizes", EXH_M, "--out", str(out / "exh"),
                 "--name", "exh"], 220, c2),
        ("compare", [*me, "compare", str(out / "fast1-cold"), str(out / "exh")], 20),
        ("compare2", [*me, "compare", str(out / "fast2-cold"), str(out / "exh")], 20),
        ("bigexh", [*me, "tune", "fp8-gemm", *_shape_args(BIG), "--search", "exhaustive",
                    "--gpus", "0,1", "--batch-sizes", "16,64", "--out", str(out / "bigexh"),
                    "--name", "bigexh"], 90, c2),
        ("ceilings", [*me, "ceilings", str(out / "bigexh")], 30, c2),
        ("verify", [*me, "tune", "verify", str(out / "fast2-cold")], 40, c2),
        ("scaling", [*me, "scaling", str(out)], 10),
    ])


def scaling(out: Path) -> int:
    """Job time of each of multi's fast runs (the job's own `done: ... S s` line: worker start to
    files written) and where its units' time went (compile-ahead wait vs the rest), from its log
    and checkpoint."""
    import re
    print(f"{'run':<11} {'gpus':>4} {'units':>5} {'job_s':>7} {'unit_sum_s':>10} {'compile_wait_s':>14}")
    walls: dict[str, float] = {}
    for tag in ("fast1-cold", "fast2-cold", "fast1-warm", "fast2-warm"):
        log = out / f"{tag}.log"
        m = re.search(r"done: (\d+) points .*?, ([\d.]+) s on", log.read_text()) if log.exists() else None
        recs = _records(out / tag) if (out / tag).exists() else []
        starts = [r for r in recs if r["t"] == "start"]
        ctx = starts[-1]["ctx"] if starts else None
        units = [r for r in recs if r["t"] == "unit" and r.get("ctx") == ctx]
        if not m:
            print(f"{tag:<11} did not finish")
            continue
        walls[tag] = float(m.group(2))
        # compile_s is cumulative per worker process: its last value is that worker's total wait
        comp = sum(max(r["compile_s"] for r in units if r["pid"] == p) for p in {r["pid"] for r in units})
        print(f"{tag:<11} {tag[4]:>4} {m.group(1):>5} {walls[tag]:>7.1f} "
              f"{sum(r['seconds'] for r in units):>10.1f} {comp:>14.1f}")
    for kind in ("cold", "warm"):
        a, b = walls.get(f"fast1-{kind}"), walls.get(f"fast2-{kind}")
        if a and b:
            print(f"{kind} Triton cache: two GPUs / one GPU = {b / a:.2f}")
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "check":
        return check()
    if cmd == "tune":
        return tune(rest)
    if cmd == "compare":
        return compare(Path(rest[0]), Path(rest[1]))
    if cmd == "all":
        return run_all(Path(rest[0]), float(rest[1]) if len(rest) > 1 else 380.0)
    if cmd == "ceilings":
        return ceilings(Path(rest[0]))
    if cmd in ("multi", "multi-lean"):
        return run_multi(Path(rest[0]), float(rest[1]) if len(rest) > 1 else 560.0,
                         lean=cmd == "multi-lean")
    if cmd == "scaling":
        return scaling(Path(rest[0]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
