"""What the sparse-MLA benchmarks share: shapes, inputs rotated past L2, the one timer
(tune/timing.py's CUDA-graph timer), the roofline ceilings (the GPU preset's measured values),
one timed cell, and the correctness check. Imported by the bench_sparse_mla*.py scripts (their
own folder is on sys.path when run as scripts).

Timing: R different (q, indices) sets (R >= 2, R x working set >= 4 x L2); a cell's calls are
captured in one CUDA graph in whole cycles of R until it holds >= MIN_GRAPH_CALLS calls (so the
graph's own launch is a small share of a call, and the rows a call gathers were evicted by the
R - 1 calls before it); tune.timing.cuda_time_us times each replay with CUDA events and reports
replay time / calls; a cell's time is the median over replays (`graph_calls` in the JSONL).
Torch eager runs un-graphed (that is what "eager" costs): R calls, same rotation, CUDA events
around each run. Roofline floor = max(bytes / measured copy rate, FLOPs / measured bf16 matmul
rate), both from profile/presets/gpus/h200.toml [measured] (docs/FIELD.md says how measured).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from servelab.kernels.sparse_mla import bytes as mla_bytes
from servelab.kernels.sparse_mla import flops as mla_flops
from servelab.kernels.sparse_mla.reference import sparse_mla_decode_reference

L2_BYTES = 60 * 2**20


@functools.cache
def ceilings() -> tuple[float, float, str]:
    """(copy bytes/s, bf16 FLOP/s, source): the H200 preset's measured ceilings."""
    from servelab.profile.presets import load_gpu

    spec, prov = load_gpu("h200", measured_peaks=True)
    return spec.hbm_bytes_s, spec.flops["bf16"], prov["source"]




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
    """us per call for each of `reps` replays of a CUDA graph holding `calls` in whole cycles
    of at least MIN_GRAPH_CALLS calls (tune.timing.cuda_time_us, the project's one timer)."""
    if DEVICE == "cpu":
        return time_host(calls, reps)
    from servelab.tune.timing import cuda_time_us

    n = len(cycled(calls, MIN_GRAPH_CALLS))  # whole cycles: every set recurs after all others
    it = itertools.cycle(calls)
    for c in calls:  # compile and warm every set outside the capture
        c()
    torch.cuda.synchronize()
    return cuda_time_us(lambda: next(it)(), reps, min_calls=n, max_calls=n)


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
    """us per call: CUDA events around each of `reps` un-graphed runs of `run` (which makes
    n_calls): torch eager only, whose host launches are part of what it costs."""
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


def compiled_info(name: str, compiled: dict) -> dict:
    """Registers, spills and shared memory of compiled kernel `name` ("split", "merge",
    "naive"), as `{name}_regs` ... (empty where not compiled, e.g. in the interpreter)."""
    k = compiled.get(name)
    if k is None:
        return {}
    md = getattr(k, "metadata", None)
    return {
        f"{name}_regs": getattr(k, "n_regs", None),
        f"{name}_spills": getattr(k, "n_spills", None),
        f"{name}_smem": getattr(md, "shared", None),
    }


def variant_calls(variant, shape, sets, kv, cfg=None, num_splits=None, lab=None, cache=None):
    """One call per input set of `variant` ("eager", "naive", "splitkv", "fp8"); the split
    calls return dispatch.SplitRun (what ran), the naive one its compiled kernel."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.naive import naive_launch

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
                return naive_launch(q, kv, idx, scale, shape.d_v, out=out, lse=lse)[2]

        else:
            src = cache if variant == "fp8" else kv

            def c(q=q, idx=idx, src=src):
                return splitkv_launch(q, src, idx, scale, shape.d_v, config=cfg,
                                      num_splits=num_splits, out=out, lse=lse, lab=lab)  # fmt: skip

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


def run_cell(log, shape, b, kv, variant, reps, cap, cfg=None, drop="", num_splits=None,
             cache=None, label="", lab=None):  # fmt: skip
    """Time one cell (shape, B, variant; cfg None: the defaults' choice) and log its record:
    the time, spread, hardware rates, % of the roofline floor, what ran and its compiler
    report. `drop` (or a whole `lab`): lab options (lab.py), wrong results, timing only."""
    from servelab.kernels.sparse_mla.splitkv.lab import Lab

    r = rotations(shape, b, cap if variant != "eager" else min(cap, 8))
    sets = make_inputs(shape, b, kv, r, seed=b)
    rec = {"shape": shape.name, "B": b, "R": r,
           "variant": label or variant + (f"-drop{drop}" if drop else "")}  # fmt: skip
    if drop:
        lab = Lab(drop=drop)
    compiled = {}
    try:
        calls = variant_calls(variant, shape, sets, kv, cfg=cfg, num_splits=num_splits, lab=lab,
                              cache=cache)  # fmt: skip
        if variant in ("splitkv", "fp8"):
            ran = calls[0]().ran  # what the timed calls run (a named config, or the defaults')
            compiled = ran.compiled
            rec.update(ran=ran.variant, rule=ran.rule, tile=ran.tile, merge=ran.merge,
                       partials=ran.partials, num_splits=ran.num_splits,
                       skipped=list(ran.skipped), config=asdict(cfg) if cfg else None)  # fmt: skip
        elif variant == "naive":
            compiled = {"naive": calls[0]()}
        if variant == "eager":
            ts = time_eager(calls, reps)
        else:
            rec["graph_calls"] = len(cycled(calls, MIN_GRAPH_CALLS)) if DEVICE == "cuda" else 1
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
    peak_bw, peak_flops, _ = ceilings()
    floor_us = max(by / peak_bw, fl / peak_flops) * 1e6
    rec.update(tflops=fl / rec["us"] / 1e6, tbs=by / rec["us"] / 1e6, floor_us=floor_us,
               pct_floor=100 * floor_us / rec["us"])  # fmt: skip
    for name in ("split", "merge", "naive"):
        rec.update(compiled_info(name, compiled))
    log.row(rec)
    rec["_compiled"] = compiled  # (not logged) the compiled kernels, for an IR report
    return rec
