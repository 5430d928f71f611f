"""Probes behind the sparse-MLA lab notebook (docs/notes/sparse-mla.md; CUDA only), one per
subcommand (the trace probes live in sparse_mla_traces.py):

- ``profile``: per-kernel device time of the default split-KV call (the split kernel and the
  merge), torch.profiler records of a CUDA graph of rotated calls, beside the graph's time
  per call; ``--waves 0.5`` also times half the splits.
- ``gather``: how fast random KV rows can be gathered at all: a Triton kernel that only loads
  each request's rows (64- or 32-row tiles) and sums them, for several grids and warps.
- ``stride``: the default kernel on the same rows in caches whose rows lie 1024, 1040, 1152
  and 1280 bytes apart (is the gather bound by the row stride?), and torch.index_select.
- ``graph-shape``: V3.2 at B = 128 timed as a graph of 1 or 24 calls over 1 or 2 input sets
  (what L2 reuse or sustained load does to a compute-bound cell).
- ``merge-trace``: at small B, where the merge kernel's programs run (SM ids) and when
  (globaltimer at entry, after the PDL wait, at the end; the last call of a replayed graph),
  and the default call timed with other merge geometries (warps, columns per program),
  interleaved over rounds.
- ``split-trace``: inside the ws split kernel (mid and large B), when each program's phases
  happen (globaltimer stamps: entry, q, the first indices, each tile's landing, score dot,
  P V, the stores; gluon_ws.TRACE_LAYOUT), summarised as medians over programs, with
  the call's time; ``--drops gather,dots`` traces the diagnostics too.
- ``grid-order``: the default call with gluon_ws's grid as (B, head blocks, splits) and as
  (head blocks, B, splits) (lab.Lab heads_first), interleaved over rounds: does running a
  request's head-block programs side by side, so that one finds the other's rows in L2, pay?
  (``--ncu``: each order's call twice, untimed, to run under Nsight Compute.)
- ``once``: the default call on the 16-bit cache and (``--fp8``) the FP8 one, each twice
  (the first compiles), untimed, each result first checked: a target for a profiler, e.g.
  ``ncu --kernel-name regex:split --launch-skip-before-match 0 --section SpeedOfLight
  --section MemoryWorkloadAnalysis_Tables python3 ... once --fp8 --shapes v3.2-tp8-h16``.

    PYTHONPATH=src python3 benchmarks/bench_sparse_mla_probes.py profile \\
        --shapes v4-flash,v4-pro --batches 16,32,64,128 [--waves 0.5]
    PYTHONPATH=src python3 benchmarks/bench_sparse_mla_probes.py gather
"""

from __future__ import annotations

import argparse
import collections
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import sparse_mla_common as bsm
import sparse_mla_traces as traces
import torch
from sparse_mla_traces import _cells, _check_reference, _fp8_reference, _graph_us, _kv


def profile(args) -> None:
    from servelab.kernels.sparse_mla.dispatch.defaults import default_config
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch

    for name, shape, kv, scale, b, sets, _ in _cells(args, seed=1, reference=False):
        for waves in [None] + ([args.waves] if args.waves else []):
            cfg = default_config(b, shape.heads, shape.d_qk)
            if waves:
                cfg = replace(cfg, waves=waves)
            calls = bsm.cycled([partial(splitkv_launch, q, kv, i, scale, shape.d_v,
                                        config=cfg) for q, i in sets],
                               bsm.MIN_GRAPH_CALLS)  # fmt: skip
            ran = calls[0]().ran
            us = _graph_us(calls, 20)
            g = bsm.capture_graph(calls)  # the same calls, profiled
            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:  # fmt: skip
                for _ in range(5):
                    g.replay()
                torch.cuda.synchronize()
            evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            agg = collections.defaultdict(list)
            for e in evs:
                kind = "merge" if "merge" in e.name else "split" if "split" in e.name else e.name
                agg[kind].append(e.device_time)
            spans = sorted((e.time_range.start, e.time_range.end) for e in evs)
            span = (spans[-1][1] - spans[0][0]) / (5 * len(calls)) if spans else float("nan")
            parts = "  ".join(f"{k} {sum(v) / len(v):7.2f} us" for k, v in sorted(agg.items()))
            print(f"{name:17} B={b:4} waves={waves or cfg.waves:<4} call {us:7.2f} us  "
                  f"kernels' span/call {span:7.2f}  {parts}  {ran}", flush=True)  # fmt: skip


def gather(args) -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def gather_sum(kv, idx, out, topk, per_split, D: tl.constexpr, BN: tl.constexpr):
        b = tl.program_id(0)
        s = tl.program_id(1)
        offs_d = tl.arange(0, D)
        acc = tl.zeros([BN, D], tl.float32)
        t0 = s * per_split
        lim = tl.minimum(topk, t0 + per_split)  # this split's rows only
        for t in tl.range(t0, t0 + per_split, BN):
            offs = t + tl.arange(0, BN)
            i = tl.load(idx + b * topk + offs, mask=offs < lim, other=0).to(tl.int64)
            acc += tl.load(kv + i[:, None] * D + offs_d[None, :], mask=(offs < lim)[:, None],
                           other=0.0).to(tl.float32)  # fmt: skip
        tl.store(out + (b * tl.num_programs(1) + s) * D + offs_d, tl.sum(acc, 0))

    shape = {s.name: s for s in bsm.SHAPES}["v4-flash"]
    kv = _kv(shape)
    for b in (32, 64, 128):
        sets = bsm.make_inputs(shape, b, kv, bsm.rotations(shape, b, 128), seed=b)
        for splits in (1, 2, 4):
            for stages, warps in ((2, 4), (3, 4), (4, 8), (3, 8)):
                out = torch.empty(b * splits, shape.d_v, device="cuda")
                per = triton.cdiv(shape.topk, splits)
                launch = gather_sum[(b, splits)]
                calls = [partial(launch, kv, i, out, shape.topk, per, D=shape.d_qk,
                                 BN=32 if warps == 4 else 64, num_stages=stages,
                                 num_warps=warps) for _, i in sets]  # fmt: skip
                us = _graph_us(calls)
                tbs = b * shape.topk * shape.d_qk * 2 / us / 1e6
                print(f"gather only, V4-Flash rows, B={b:4} splits={splits} stages={stages} "
                      f"warps={warps}: {us:7.2f} us  {tbs:.2f} TB/s", flush=True)  # fmt: skip


def stride(args) -> None:
    from servelab.kernels.sparse_mla.dispatch.defaults import geometry
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_decode
    from servelab.kernels.sparse_mla.splitkv.lab import Lab

    shape = {s.name: s for s in bsm.SHAPES}["v4-flash"]
    b, scale = 128, shape.d_qk**-0.5
    for width in (512, 520, 576, 640):
        kv = _kv(shape, width)[:, : shape.d_qk]  # the same 512 columns, rows `width` apart
        sets = bsm.make_inputs(shape, b, kv, bsm.rotations(shape, b, 128), seed=b)
        for drop in ("", "dots"):
            calls = [partial(splitkv_decode, q, kv, i, scale, shape.d_v,
                             config=geometry("gluon_ws"), lab=Lab(drop=drop)) for q, i in sets]  # fmt: skip
            print(f"V4-Flash B={b} rows {width * 2} B apart: ws {drop or 'full':5} "
                  f"{_graph_us(calls):8.2f} us", flush=True)  # fmt: skip
        idx = [i.view(-1).long() for _, i in sets]
        out = torch.empty(idx[0].numel(), shape.d_qk, dtype=kv.dtype, device="cuda")
        us = _graph_us([partial(torch.index_select, kv, 0, i, out=out) for i in idx])
        print(f"V4-Flash B={b} rows {width * 2} B apart: index_select {us:8.2f} us "
              f"{idx[0].numel() * shape.d_qk * 2 / us / 1e6:.2f} TB/s read", flush=True)  # fmt: skip
        del kv
        torch.cuda.empty_cache()


def graph_shape(args) -> None:
    shape = {s.name: s for s in bsm.SHAPES}["v3.2"]
    kv = _kv(shape)
    sets = bsm.make_inputs(shape, 128, kv, 2, seed=128)
    for rnd in range(2):
        for label, r, n in (("1 set, 1 call", 1, 1), ("1 set, 24 calls", 1, 24),
                            ("2 sets, 24 calls", 2, 24), ("2 sets, 2 calls", 2, 2)):  # fmt: skip
            calls = bsm.variant_calls("splitkv", shape, sets[:r], kv)
            s = bsm.summarize(bsm.time_graph(bsm.cycled(calls, n), 40))
            print(f"round {rnd} V3.2 B=128 graph of {label:16s} {s['us']:8.2f} us "
                  f"(p10 {s['p10_us']:.2f}, p90 {s['p90_us']:.2f})", flush=True)  # fmt: skip


def once(args) -> None:
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch

    for name, shape, kv, scale, b, sets, ref in _cells(args):
        q0, i0 = sets[0]
        kinds = [("bf16", kv, ref)]
        if args.fp8:
            cache = bsm.fp8_cache(shape, kv)
            want = _fp8_reference(cache, kv, q0, i0, scale, shape.d_v)
            kinds.append(("fp8", cache, want))
        for kind, cache_or_kv, want in kinds:
            for _ in range(2):
                run = splitkv_launch(q0, cache_or_kv, i0, scale, shape.d_v)
            torch.cuda.synchronize()
            _check_reference(run.out, run.lse, want, f"{name} B={b} {kind}")
            print(f"{name} B={b} {kind}: {run.ran}", flush=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="probe", required=True)
    p = sub.add_parser("profile", help="split vs merge device time per call")
    p.add_argument("--shapes", default="v4-flash,v4-pro,v3.2,v4-flash-tp2-h32")
    p.add_argument("--batches", default="16,32,64,128")
    p.add_argument("--waves", type=float, default=0.0, help="also time this many waves")
    sub.add_parser("gather", help="a gather-only kernel's bandwidth (V4-Flash rows)")
    sub.add_parser("stride", help="the default kernel at several KV row strides")
    sub.add_parser("graph-shape", help="V3.2 B = 128 in graphs of 1 or 24 calls, 1 or 2 sets")
    p = sub.add_parser("merge-trace", help="where and when the merge's programs run; merge geometries")
    p.add_argument("--shapes", default="v4-flash,v4-flash-tp2-h32,v3.2-tp8-h16,v4-pro,v3.2")
    p.add_argument("--batches", default="1,2,4,8")
    p.add_argument("--variants", default="default,cap8192,w2c256,w8",
                   help="merge geometries, comma-separated: default, or in this order wN "
                        "(warps), cN (columns per program), capN (tile cap in elements), kN "
                        "(splits per unrolled step), cw/cw0 (column warps on/off); then "
                        "optionally /p16 (16-bit partials)")  # fmt: skip
    p.add_argument("--partials", choices=("default", "fp32", "input"), default="default",
                   help="the split's partial dtype (input: q's 16-bit dtype)")
    p.add_argument("--num-splits", type=int, default=None, help="split count (default: chosen)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=30)
    p = sub.add_parser("split-trace", help="phase times inside the ws split kernel's programs")
    p.add_argument("--shapes", default="v4-flash,v4-flash-tp2-h32,v4-pro,v3.2")
    p.add_argument("--batches", default="16,32,64,128")
    p.add_argument("--drops", default="", help="also trace with these diagnostics (gather,dots)")
    p.add_argument("--variants", default="default",
                   help=f"kernel variants, timed interleaved, the first the baseline: "
                        f"{', '.join(traces.WS_VARIANTS)}, each optionally followed by "
                        f"{', '.join(traces.WS_SUFFIXES)} (16-bit or fp32 partials)")  # fmt: skip
    p.add_argument("--partials", choices=("default", "fp32", "input"), default="default",
                   help="the split's partial dtype (input: q's 16-bit dtype)")
    p.add_argument("--num-splits", type=int, default=None, help="split count (default: chosen)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", type=Path, default=None, help="save each raw trace here (.pt)")
    p = sub.add_parser("grid-order", help="gluon_ws's grid with B or the head blocks first")
    p.add_argument("--shapes", default="v3.2,v4-pro")
    p.add_argument("--batches", default="64,128")
    p.add_argument("--ncu", action="store_true",
                   help="no timing: each order's bf16 call twice, for a profiler, e.g. ncu "
                        "--kernel-name regex:gluon_ws --metrics dram__bytes_read.sum,"
                        "lts__t_sector_hit_rate.pct,gpu__time_duration.sum python3 ...")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=30)
    p = sub.add_parser("once", help="the default call (and --fp8 the FP8 one) twice, untimed, "
                       "for a profiler")  # fmt: skip
    p.add_argument("--shapes", default="v3.2-tp8-h16")
    p.add_argument("--batches", default="128")
    p.add_argument("--fp8", action="store_true", help="also the FP8 cache's default")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("these probes time CUDA kernels: run them on a machine with an NVIDIA GPU")
    by_shape = {s.name for s in bsm.SHAPES}
    if args.probe in ("profile", "merge-trace", "split-trace", "grid-order", "once"):
        unknown = set(args.shapes.split(",")) - by_shape
        if unknown:
            ap.error(f"unknown shape(s) {sorted(unknown)}; choose from {sorted(by_shape)}")
    {"profile": profile, "gather": gather, "stride": stride,
     "graph-shape": graph_shape, "merge-trace": traces.merge_trace,
     "split-trace": traces.split_trace, "grid-order": traces.grid_order,
     "once": once}[args.probe](args)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
