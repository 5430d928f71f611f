"""Sparse MLA decode on one GPU: torch eager vs the (B, H) Triton fallback vs split-KV.

One invocation does everything and prints a compact table last:
  1. a correctness check per shape (bf16, B=3, vs the fp32 reference),
  2. optionally (--sweep) a sweep of split-kernel configs at B in {1, 8, 64},
  3. the timing table per shape and batch for eager / naive / splitkv,
  4. diagnostics for splitkv (a dot dropped, combine cost, registers and spills).
Full results go to OUT/bench_sparse_mla.jsonl and OUT/bench_sparse_mla.log.
--compare instead times the merge variants at B <= 8 (two kernels, PDL, fused) and the two
FP8 kernels against bf16 (issue 5 follow-up), compiling all cells first; --wait-file lets GPU
tests run during that compile phase and holds the timing until they are done.

Timing: R different (q, indices) sets (R >= 2, R x working set >= 4 x L2), and their calls
captured in one CUDA graph in whole cycles of R until it holds >= 24 calls (so the graph's
own launch is a small share of a call), so the rows a call gathers were evicted by the R-1
calls before it; each replay is timed with CUDA events, and the reported time is the median
over replays of replay time / calls in the graph (`graph_calls` in the JSONL). Torch eager
runs un-graphed (that is what "eager" costs): R calls, same rotation.
Roofline floor = max(bytes / 4.24e12 B/s, FLOPs / 701e12 FLOP/s), the copy bandwidth and bf16
matmul rate measured on this H200 (CONTEXT.md).

    PYTHONPATH=src python3 benchmarks/bench_sparse_mla.py --out $OUT [--quick] [--sweep]
    PYTHONPATH=src python3 benchmarks/bench_sparse_mla.py --compare --out $OUT [--wait-file F]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from servelab.kernels.sparse_mla import bytes as mla_bytes
from servelab.kernels.sparse_mla import flops as mla_flops
from servelab.kernels.sparse_mla.reference import sparse_mla_decode_reference

PEAK_BW = 4.24e12  # B/s, measured copy bandwidth (read + write) on the H200
PEAK_FLOPS = 701e12  # FLOP/s, measured bf16 8192^3 matmul on the H200
L2_BYTES = 60 * 2**20


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    heads: int
    d_qk: int
    d_v: int
    topk: int


SHAPES = [
    Shape("v3.2", 128, 576, 512, 2048),
    Shape("v4-flash", 64, 512, 512, 640),
    Shape("v4-pro", 128, 512, 512, 1152),
    Shape("v3.2-tp8-h16", 16, 576, 512, 2048),
    Shape("v4-flash-tp2-h32", 32, 512, 512, 640),
]
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]
# --smoke: the whole pipeline on the CPU interpreter at toy sizes (host clock, no graphs), so
# the script is debugged before it costs device time.
SMOKE_SHAPES = [Shape("toy-tail", 20, 48, 32, 70), Shape("toy", 8, 32, 32, 40)]
DEVICE = "cuda"
ROT_CAP = 128  # most rotated input sets per graph
# Fewest calls per graph: a graph cycles through its R input sets (whole cycles) until it
# holds this many calls, so the graph's own launch (~5 us a replay on the H200) adds < 0.25 us
# to a call. With R calls alone (R = 3 at V4-Flash B = 128) a third of it went to each call.
MIN_GRAPH_CALLS = 24


class Log:
    def __init__(self, out: Path):
        out.mkdir(parents=True, exist_ok=True)
        self.text = (out / "bench_sparse_mla.log").open("w")
        self.rows = (out / "bench_sparse_mla.jsonl").open("w")

    def say(self, msg: str) -> None:
        print(msg, flush=True)
        self.text.write(msg + "\n")
        self.text.flush()

    def row(self, rec: dict) -> None:
        self.rows.write(json.dumps(rec) + "\n")
        self.rows.flush()


def wait_for_file(log: Log, path: str, t0: float) -> None:
    """--wait-file: after compiling, hold the timing until `path` exists (GPU tests running
    meanwhile must not share the GPU with timed cells)."""
    if not path:
        return
    while not Path(path).exists():
        time.sleep(0.5)
    log.say(f"tests done; timing from {time.time() - t0:.0f} s")


def make_inputs(shape: Shape, b: int, kv: torch.Tensor, r: int, seed: int):
    """R rotated (q, indices) sets over one shared KV pool (random rows, no padding)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    sets = []
    for _ in range(r):
        q = torch.randn(b, shape.heads, shape.d_qk, device=DEVICE, generator=gen)
        idx = torch.randint(0, kv.shape[0], (b, shape.topk), device=DEVICE, generator=gen)
        sets.append((q.to(kv.dtype), idx.to(torch.int32)))
    return sets


def rotations(shape: Shape, b: int, cap: int) -> int:
    """Input sets per graph: enough that a call's rows were evicted from L2 by the calls
    between two uses of its set (R x working set >= 4 x L2), and at least 2, so that a graph
    cycling through them never runs the same set twice in a row."""
    ws = mla_bytes(b, shape.heads, shape.topk, shape.d_qk, shape.d_v)
    return max(2 if cap >= 2 else 1, min(cap, ROT_CAP, math.ceil(4 * L2_BYTES / ws)))


def cycled(calls: list, n: int) -> list:
    """`calls` repeated in order, whole cycles only, until there are at least n (a graph's
    calls): every set then comes back after all R - 1 others, also across replays (a partial
    last cycle would bring the first sets back sooner, their rows possibly still in L2)."""
    return calls * max(1, -(-n // len(calls)))


def time_host(calls, reps: int) -> list[float]:
    """Smoke mode only: host clock around the calls."""
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        for c in calls:
            c()
        out.append((time.perf_counter() - t) * 1e6 / len(calls))
    return out


def capture_graph(calls) -> torch.cuda.CUDAGraph:
    """A CUDA graph of all `calls` back to back (compiled and warmed first, also on a side
    stream as capture wants), replayed once."""
    for c in calls:  # compile + warm outside capture
        c()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    return g


def time_graph(calls, reps: int) -> list[float]:
    """us per call for each replay of a graph holding all `calls` back to back."""
    if DEVICE == "cpu":
        return time_host(calls, reps)
    g = capture_graph(calls)
    out = time_events(g.replay, reps, len(calls))
    del g
    return out


def time_eager(calls, reps: int) -> list[float]:
    if DEVICE == "cpu":
        return time_host(calls, reps)
    for c in calls:
        c()
    torch.cuda.synchronize()

    def run() -> None:
        for c in calls:
            c()

    return time_events(run, reps, len(calls))


def time_events(run, reps: int, n_calls: int) -> list[float]:
    """us per call: CUDA events around each of `reps` runs of `run` (which makes n_calls)."""
    out = []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        e0.record()
        run()
        e1.record()
        e1.synchronize()
        out.append(e0.elapsed_time(e1) * 1e3 / n_calls)
    return out


def summarize(ts: list[float]) -> dict:
    ts = sorted(ts)
    q = statistics.quantiles(ts, n=10) if len(ts) >= 2 else [ts[0]] * 9
    return {"us": statistics.median(ts), "p10_us": q[0], "p90_us": q[-1], "n": len(ts)}


def compiled_info(name: str) -> dict:
    from servelab.kernels.sparse_mla import naive, splitkv

    k = {**naive.LAST_COMPILED, **splitkv.LAST_COMPILED}.get(name)
    if k is None:
        return {}
    md = getattr(k, "metadata", None)
    return {
        f"{name}_regs": getattr(k, "n_regs", None),
        f"{name}_spills": getattr(k, "n_spills", None),
        f"{name}_smem": getattr(md, "shared", None),
    }


def variant_calls(variant, shape, sets, kv, cfg=None, num_splits=None, drop="", cache=None):
    from servelab.kernels.sparse_mla.naive import naive_decode
    from servelab.kernels.sparse_mla.splitkv import splitkv_decode

    scale = shape.d_qk**-0.5
    b = sets[0][0].shape[0]
    out = torch.empty(b, shape.heads, shape.d_v, dtype=kv.dtype, device=DEVICE)
    lse = torch.empty(b, shape.heads, dtype=torch.float32, device=DEVICE)
    calls = []
    for q, idx in sets:
        if variant == "eager":

            def c(q=q, idx=idx):
                sparse_mla_decode_reference(q, kv, idx, scale, shape.d_v, compute_dtype=kv.dtype)

        elif variant == "naive":

            def c(q=q, idx=idx):
                naive_decode(q, kv, idx, scale, shape.d_v, out=out, lse=lse)

        else:
            src = cache if variant == "fp8" else kv

            def c(q=q, idx=idx, src=src):
                splitkv_decode(q, src, idx, scale, shape.d_v, config=cfg, num_splits=num_splits,
                               out=out, lse=lse, drop=drop)  # fmt: skip

        calls.append(c)
    return calls


def fp8_cache(shape: Shape, kv: torch.Tensor):
    """V3.2 (D_qk 576): 512 e4m3 columns in 128-wide tiles (656 B/token); V4 (D_qk 512): 448
    in 64-wide tiles (604 B/token)."""
    from servelab.kernels.sparse_mla.fp8 import quantize_kv

    if shape.d_qk == 576:
        return quantize_kv(kv, 512, 128)
    if shape.d_qk == 512:
        return quantize_kv(kv, 448, 64)
    # smoke toys: e4m3 up to d_v (or 16 short of it when there is no tail), 16-wide tiles
    return quantize_kv(kv, shape.d_v if shape.d_v < shape.d_qk else shape.d_v - 16, 16)


def check_correct(log: Log, shape: Shape, kv: torch.Tensor, cache) -> dict:
    from servelab.kernels.sparse_mla import sparse_mla_decode

    rec = {"shape": shape.name}
    for b in (3, 16):  # B=16 takes the 64-head config for H >= 64, B=3 the 16-head one
        (q, idx), = make_inputs(shape, b, kv, 1, seed=123)  # fmt: skip
        idx[1, ::7] = -1
        idx[2, :] = -1  # all padding: out 0, lse -inf
        scale = shape.d_qk**-0.5
        ref_o, ref_l = sparse_mla_decode_reference(q, kv, idx, scale, shape.d_v)
        ref8_o, ref8_l = sparse_mla_decode(q, cache, idx, scale, shape.d_v, variant="reference")
        for v in ("naive", "splitkv", "fp8"):
            src = cache if v == "fp8" else kv
            o, lg = sparse_mla_decode(q, src, idx, scale, shape.d_v, variant=v)
            if v == "fp8":  # against the reference on the dequantised cache
                ref_o, ref_l = ref8_o, ref8_l
            rel = ((o.float() - ref_o.float()).norm() / ref_o.float().norm()).item()
            rec[f"B{b}_{v}_rel_err"] = rel
            fin = torch.isfinite(ref_l)
            ok_pad = bool(torch.all(o[2] == 0)) and bool(torch.all(torch.isneginf(lg[2])))
            rec[f"B{b}_{v}_lse_max_err"] = (lg[fin] - ref_l[fin]).abs().max().item()
            rec[f"B{b}_{v}_pad_ok"] = float(ok_pad)
    log.say(f"check {shape.name}: " + " ".join(f"{k}={v:.2e}" for k, v in rec.items()
                                               if k != "shape"))  # fmt: skip
    return rec


def sweep_configs(shape: Shape):
    """The split-kernel search space, as data: geometry x index prefetch."""
    from servelab.kernels.sparse_mla.splitkv import SplitConfig as C

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


def ir_report(log: Log, out: Path, tag: str) -> None:
    """What the compiler made of the latest split kernel: async copies, wgmma vs mma.sync,
    vector width of global loads; the TTGIR goes to OUT for reading."""
    from servelab.kernels.sparse_mla import splitkv

    k = splitkv.LAST_COMPILED.get("split")
    info = compiled_info("split")
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


def run_cell(log, shape, b, kv, variant, reps, cap, cfg=None, drop="", num_splits=None,
             cache=None, label=""):  # fmt: skip
    from servelab.kernels.sparse_mla.splitkv import _num_sms, choose_num_splits, default_config

    r = rotations(shape, b, cap if variant != "eager" else min(cap, 8))
    sets = make_inputs(shape, b, kv, r, seed=b)
    rec = {"shape": shape.name, "B": b, "R": r,
           "variant": label or variant + (f"-drop{drop}" if drop else "")}  # fmt: skip
    if variant in ("splitkv", "fp8"):
        fp8_tile = cache.tile if variant == "fp8" else None
        cfg = cfg or default_config(b, shape.heads, shape.d_qk, kv.dtype, fp8_tile)
        ns = num_splits or choose_num_splits(b, shape.heads, shape.topk, cfg, _num_sms(kv.device))
        rec.update(config=asdict(cfg), num_splits=ns)
    else:
        ns = None
    try:
        calls = variant_calls(variant, shape, sets, kv, cfg=cfg, num_splits=ns, drop=drop,
                              cache=cache)  # fmt: skip
        if variant == "eager":
            ts = time_eager(calls, reps)
        else:
            calls = cycled(calls, MIN_GRAPH_CALLS if DEVICE == "cuda" else 1)
            rec["graph_calls"] = len(calls)
            ts = time_graph(calls, reps)
    except Exception as e:  # noqa: BLE001 - a config that does not compile is a result too
        rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        log.say(f"{shape.name} B={b} {rec['variant']}: {rec['error']}")
        log.row(rec)
        return rec
    rec.update(summarize(ts))
    fl = mla_flops(b, shape.heads, shape.topk, shape.d_qk, shape.d_v)
    per_tok = cache.bytes_per_token if variant == "fp8" else None
    by = mla_bytes(b, shape.heads, shape.topk, shape.d_qk, shape.d_v, kv_bytes_per_token=per_tok)
    floor_us = max(by / PEAK_BW, fl / PEAK_FLOPS) * 1e6
    rec.update(tflops=fl / rec["us"] / 1e6, tbs=by / rec["us"] / 1e6, floor_us=floor_us,
               pct_floor=100 * floor_us / rec["us"])  # fmt: skip
    if variant in ("splitkv", "fp8"):
        rec.update(compiled_info("split"))
        if ns > 1:
            rec.update(compiled_info("combine"))
    elif variant == "naive":
        rec.update(compiled_info("naive"))
    log.row(rec)
    return rec


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
    global DEVICE, ROT_CAP
    log = Log(args.out)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported
        DEVICE, ROT_CAP = "cpu", 2
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

    log.say(f"device {name} torch {torch.__version__} triton {triton.__version__} "
            f"date {time.strftime('%Y-%m-%d %H:%M:%S')}")  # fmt: skip
    if args.compare:
        # The follow-up's cells live in their own file and use this module's helpers: let it
        # import this running script (with --smoke's DEVICE), not a second copy of it.
        sys.modules.setdefault("bench_sparse_mla", sys.modules[__name__])
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
        dtype = torch.float16 if DEVICE == "cpu" else torch.bfloat16
        kv = torch.randn(pool, shape.d_qk, device=DEVICE).to(dtype)
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
                    ir_report(log, args.out, f"{shape.name} B={b}")
            if b == 64 and shape.name in ("v4-flash", "v3.2", "v3.2-tp8-h16"):
                for drop in ("qk", "pv"):
                    cells[f"drop{drop}"] = run_cell(log, shape, b, kv, "splitkv", reps, 128,
                                                    drop=drop)  # fmt: skip
            if b == 64 and shape.name in ("v4-flash", "v3.2"):
                # Candidate for large B: two 32-head programs per SM instead of one 64-head.
                from servelab.kernels.sparse_mla.splitkv import SplitConfig

                for pf in (False,):
                    c = SplitConfig(32, 32, 4, 2, 2, prefetch_idx=pf)
                    cells[f"bh32c2pf{int(pf)}"] = run_cell(log, shape, b, kv, "splitkv", reps,
                                                           128, cfg=c)  # fmt: skip
            table.append((shape, b, cells))
            s = cells["splitkv"]
            log.say(f"{shape.name} B={b}: " + " ".join(
                f"{k}={c.get('us', float('nan')):.1f}us" for k, c in cells.items()))  # fmt: skip
            if "error" in s:
                log.say(f"  splitkv error: {s['error']}")
        del kv, cache
        if DEVICE == "cuda":
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
