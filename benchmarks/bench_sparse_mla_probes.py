"""Probes behind docs/performance.md's sparse-MLA follow-ups (CUDA only), one per subcommand:

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
- ``grid-order``: the default call (16-bit cache, and with ``--fp8`` the FP8 one) with the Gluon
  kernels' grid as (B, head blocks, splits) and as (head blocks, B, splits) (HEADS_FIRST),
  interleaved over rounds: does running a request's head-block programs side by side, so
  that one finds the other's rows in L2, pay? (``--ncu``: each order's call twice, untimed,
  to run under Nsight Compute for the DRAM bytes.)
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
import re
import statistics
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sparse_mla as bsm  # noqa: E402

POOL = 1 << 20  # KV rows, as in the benchmarks (1.1-1.2 GB: far beyond L2)


def _kv(shape: bsm.Shape, width: int | None = None) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(POOL, width or shape.d_qk, device="cuda").to(torch.bfloat16)


def _graph_us(calls, reps: int = 30) -> float:
    return bsm.summarize(bsm.time_graph(bsm.cycled(calls, bsm.MIN_GRAPH_CALLS), reps))["us"]


def profile(args) -> None:
    from servelab.kernels.sparse_mla.splitkv import LAST_PATH, default_config, splitkv_decode

    for name, shape, kv, scale, b, sets, _ in _cells(args, seed=1, reference=False):
        for waves in [None] + ([args.waves] if args.waves else []):
            cfg = default_config(b, shape.heads, shape.d_qk, torch.bfloat16)
            if waves:
                cfg = replace(cfg, waves=waves)
            calls = bsm.cycled([partial(splitkv_decode, q, kv, i, scale, shape.d_v,
                                        config=cfg) for q, i in sets],
                               bsm.MIN_GRAPH_CALLS)  # fmt: skip
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
                  f"kernels' span/call {span:7.2f}  {parts}  {LAST_PATH}", flush=True)  # fmt: skip


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
    from servelab.kernels.sparse_mla.splitkv import GLUON_WS, splitkv_decode

    shape = {s.name: s for s in bsm.SHAPES}["v4-flash"]
    b, scale = 128, shape.d_qk**-0.5
    for width in (512, 520, 576, 640):
        kv = _kv(shape, width)[:, : shape.d_qk]  # the same 512 columns, rows `width` apart
        sets = bsm.make_inputs(shape, b, kv, bsm.rotations(shape, b, 128), seed=b)
        for drop in ("", "dots"):
            calls = [partial(splitkv_decode, q, kv, i, scale, shape.d_v, config=GLUON_WS,
                             drop=drop) for q, i in sets]  # fmt: skip
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


# A merge geometry: "default", or any of, in this order: wN (warps), cN (d_v columns per
# program), capN (the default columns' cap in tile elements), kN (splits per unrolled step),
# cw / cw0 (warps along the columns or not, launch_merge's column_warps; its default is cw for
# 16-bit partials), e.g. "w2c256", "cap8192", "cw".
# A "+rw" suffix rewrites the partials with a torch copy between the split kernel and the
# merge (is a slow merge due to how the split kernel wrote them?); a "/p16" suffix has the
# split write 16-bit partials (q's dtype), as --partials input does for every variant.
MERGE_VARIANT = re.compile(
    r"(?:default|(?=[wck])(?:w(\d+))?(?:c(\d+))?(?:cap(\d+))?(?:k(\d+))?(cw0?)?)(\+rw)?"
)


def _merge_overrides(label: str) -> dict:
    label, p16 = label.removesuffix("/p16"), label.endswith("/p16")
    m = MERGE_VARIANT.fullmatch(label)
    sizes = [int(v) for v in m.groups()[:4] if v is not None] if m else []
    if m is None or any(v < 1 or v & (v - 1) for v in sizes):
        raise SystemExit(f"bad merge variant {label!r}: use default or, in this order, wN, cN, "
                         "capN, kN, cw or cw0 (e.g. w2c256, cap8192cw), then optionally +rw "
                         "and /p16; N a power of two")  # fmt: skip
    keys = ("num_warps", "block_dvc", "tile_elems", "s_chunk")
    out = {k: int(v) for k, v in zip(keys, m.groups()[:4], strict=True) if v}
    if m.group(5):
        out["column_warps"] = m.group(5) == "cw"
    if m.group(6):
        out["rewrite"] = True
    if p16:
        out["p16"] = True
    return out


def _trace_summary(tr: torch.Tensor) -> str:
    """One line from a merge trace [programs, 4] (SM, entry, after wait, end; ns)."""
    sm, t_in, t_wait, t_end = (tr[:, i] for i in range(4))
    per_sm = torch.bincount(sm.long())
    per_sm = per_sm[per_sm > 0]
    t0 = int(t_wait.min())  # the split kernel's results are visible from here

    def us(x) -> float:
        return float(x) / 1e3

    run = (t_end - t_wait).double()
    return (f"programs {tr.shape[0]:4}  SMs {per_sm.numel():3}  per SM max {int(per_sm.max())}  "
            f"entered {us(t_in.min() - t0):+6.2f}..{us(t_in.max() - t0):+6.2f} us  "
            f"waits end over {us(t_wait.max() - t0):5.2f} us  "
            f"run median {us(run.median()):5.2f} max {us(run.max()):5.2f}  "
            f"last end {us(t_end.max() - t0):5.2f} us after the first wait")  # fmt: skip


def _cells(args, seed: int | None = None, reference: bool = True):
    """Per shape and batch of args: (name, shape, kv, scale, b, sets, ref), with the rotated
    input sets of the benches (seeded by B unless `seed`) and ref = set 0's fp32 reference
    (out, lse), or None."""
    from servelab.kernels.sparse_mla.reference import sparse_mla_decode_reference

    shapes = {s.name: s for s in bsm.SHAPES}
    for name in args.shapes.split(","):
        shape = shapes[name]
        kv = _kv(shape)
        scale = shape.d_qk**-0.5
        for b in [int(x) for x in args.batches.split(",")]:
            sets = bsm.make_inputs(shape, b, kv, bsm.rotations(shape, b, 128),
                                   seed=b if seed is None else seed)  # fmt: skip
            ref = None
            if reference:
                q0, i0 = sets[0]
                ref = sparse_mla_decode_reference(q0, kv, i0, scale, shape.d_v,
                                                  out_dtype=torch.float32)  # fmt: skip
            yield name, shape, kv, scale, b, sets, ref
        del kv
        torch.cuda.empty_cache()


def _fp8_reference(cache, kv, q, indices, scale, d_v):
    """The fp32 reference on the dequantised FP8 cache (what an FP8 kernel is checked against)."""
    from servelab.kernels.sparse_mla.fp8 import dequantize_kv
    from servelab.kernels.sparse_mla.reference import sparse_mla_decode_reference

    return sparse_mla_decode_reference(q, dequantize_kv(cache).to(kv.dtype), indices, scale, d_v,
                                       out_dtype=torch.float32)  # fmt: skip


def _check_reference(out, lse, ref, what: str) -> None:
    """As the geometry bench checks a cell: out's relative error against the fp32 reference
    (bf16 P and partials: ~2e-3) <= 1e-2 and lse within 1e-3; else stop, naming the cell."""
    rel = ((out.float() - ref[0]).norm() / ref[0].norm()).item()
    lse_err = (lse - ref[1]).abs().max().item()
    if not (rel <= 1e-2 and lse_err <= 1e-3):
        raise SystemExit(f"{what}: out relative error {rel:.3g} (> 1e-2) or lse error "
                         f"{lse_err:.3g} (> 1e-3) against the fp32 reference")  # fmt: skip


def _rounds_table(args, labels: list[str], times: dict, base: str) -> None:
    """The last table of a probe: us per call for each cell and variant, the median over the
    rounds of each round's median; * marks a variant faster than `base` by more than 2%."""
    print(f"\nus per call, median over {args.rounds} interleaved rounds; * = faster than "
          f"{base} by > 2%")  # fmt: skip
    print(f"{'shape':17} {'B':>3} " + " ".join(f"{lab:>9}" for lab in labels))
    for name in args.shapes.split(","):
        for b in [int(x) for x in args.batches.split(",")]:
            if (name, b, labels[0]) not in times:
                continue
            med = {lab: statistics.median(times[(name, b, lab)]) for lab in labels}
            ref = med.get(base)
            cells = [f"{med[lab]:8.2f}{'*' if ref and med[lab] < 0.98 * ref else ' '}"
                     for lab in labels]  # fmt: skip
            print(f"{name:17} {b:3} " + " ".join(cells), flush=True)


def merge_trace(args) -> None:
    from servelab.kernels.sparse_mla import merge as merge_mod
    from servelab.kernels.sparse_mla.splitkv import LAST_PATH, default_config, splitkv_decode

    original = merge_mod.launch_merge
    labels = args.variants.split(",")
    variants = {label: _merge_overrides(label) for label in labels}
    table = collections.defaultdict(list)
    try:
        for name, shape, kv, scale, b, sets, ref in _cells(args):
            for rnd in range(args.rounds):
                for label in labels:
                    kw = variants[label]
                    state = {}

                    def launch(partials, out, lse, pdl, _kw=kw, _state=state, **more):
                        kw2 = dict(_kw, **more)
                        kw2.pop("p16", None)
                        if kw2.pop("rewrite", False):
                            partials[0].copy_(partials[0].clone())
                        if "trace" in _state:
                            kw2["trace"] = _state["trace"]
                        _state["grid"] = merge_mod.merge_grid(
                            tuple(partials[0].shape), kw2.get("block_dvc"),
                            kw2.get("tile_elems", merge_mod.MERGE_TILE_ELEMS))[0]  # fmt: skip
                        return original(partials, out, lse, pdl, **kw2)

                    merge_mod.launch_merge = launch
                    cfg = default_config(b, shape.heads, shape.d_qk, torch.bfloat16)
                    if kw.get("p16") or args.partials != "default":
                        cfg = replace(cfg, partial_dtype="input" if kw.get("p16")
                                      else args.partials)  # fmt: skip
                    calls = [partial(splitkv_decode, q, kv, i, scale, shape.d_v, config=cfg,
                                     num_splits=args.num_splits) for q, i in sets]  # fmt: skip
                    out, lse = calls[0]()
                    if LAST_PATH["merge"] in ("single", "fused"):
                        print(f"{name} B={b}: merge {LAST_PATH['merge']}, nothing to trace")
                        break
                    _check_reference(out, lse, ref, f"{name} B={b} {label}")
                    us = _graph_us(calls, args.reps)
                    table[(name, b, label)].append(us)
                    line = ""
                    if rnd == 0:
                        grid = state["grid"]
                        state["trace"] = torch.zeros(4 * grid[0] * grid[1] * grid[2],
                                                     dtype=torch.int64, device="cuda")
                        g = bsm.capture_graph(bsm.cycled(calls, bsm.MIN_GRAPH_CALLS))
                        for _ in range(3):
                            g.replay()
                        torch.cuda.synchronize()
                        line = _trace_summary(state["trace"].view(-1, 4).cpu())
                        del g
                    print(f"round {rnd} {name:17} B={b:3} merge {label:8} "
                          f"{LAST_PATH['merge']:6} {LAST_PATH['partials']:8} {us:7.2f} us  "
                          f"{line}", flush=True)  # fmt: skip
                else:
                    continue
                break
    finally:
        merge_mod.launch_merge = original
    _rounds_table(args, labels, table, "default")


def _split_trace_summary(tr: torch.Tensor, n_local: torch.Tensor) -> dict:
    """Phase times of one traced ws launch, us: the medians over programs, and over their tiles
    for the per-tile steps (torch's median: the lower middle value); "span" and
    "entry_spread" from the first entry to the last store / the last entry.
    tr: [programs, TRACE_COLS] int64 (-1 where unstamped); n_local: tiles per program."""
    from servelab.kernels.sparse_mla.gluon_ws import TRACE_LAYOUT as L
    from servelab.kernels.sparse_mla.gluon_ws import TRACE_TILES

    # Stamps are ~1.8e18 ns: relative to the first entry before leaving int64 (a float64 of
    # the absolute time rounds to 256 ns).
    stamped = tr >= 0  # unstamped: -1 (a split past the last tile, tiles past the trace)
    t0 = int(tr[:, L["entry"]][stamped[:, L["entry"]]].min())
    tr = torch.where(stamped, tr - t0, 0).double()
    tr[~stamped] = float("nan")
    entry = tr[:, L["entry"]]

    def col(name, j=0):
        return tr[:, L[name] + j]

    def med(x) -> float:
        x = x[~torch.isnan(x)]
        return float(x.median()) / 1e3 if x.numel() else float("nan")

    end = torch.maximum(col("scorer_stored"), col("second_stored"))
    out = {
        "span": float(end.nan_to_num(float("-inf")).max()) / 1e3,  # -> last store issued
        "entry_spread": float(entry.nan_to_num(float("-inf")).max()) / 1e3,
        "idx0": med(col("idx0") - entry),
        "q": med(col("q") - entry),
        "ready0": med(col("ready", 0) - entry),
        "loop": med(col("scorer_end") - col("ready", 0)),
        "store": med(col("scorer_stored") - col("scorer_end")),
        "second_store": med(col("second_stored") - col("second_end")),
        "program": med(end - entry),
    }
    # Per-tile steps of the scorer over each program's stamped tiles (waits and landing gaps
    # from its second tile on).
    qk, soft_pv, wait, land = [], [], [], []
    nt = int(min(int(n_local.max()), TRACE_TILES))
    for j in range(nt):
        has = n_local > j
        ready, scored, pv1 = col("ready", j), col("scored", j), col("pv1", j)
        qk.append(torch.where(has, scored - ready, float("nan")))
        soft_pv.append(torch.where(has, pv1 - scored, float("nan")))
        if j > 0:
            wait.append(torch.where(has, ready - col("pv1", j - 1), float("nan")))
            land.append(torch.where(has, col("landed", j) - col("landed", j - 1), float("nan")))
    cat = lambda xs: torch.cat(xs) if xs else torch.tensor([float("nan")])  # noqa: E731
    out.update(qk=med(cat(qk)), softmax_pv=med(cat(soft_pv)), wait=med(cat(wait)),
               land_gap=med(cat(land)))  # fmt: skip
    return out


SPLIT_TRACE_COLS = ("span", "program", "entry_spread", "idx0", "q", "ready0", "loop",
                    "land_gap", "qk", "softmax_pv", "wait", "store", "second_store")  # fmt: skip


# split-trace variants: label -> the ws module switches (gluon_ws) they set.
WS_VARIANTS = {
    "default": {},
    "direct": {"STAGED_STORES": False},  # O stored from the accumulator's layout
    "qearly": {"Q_AFTER_INDICES": False},  # q's copies issued at entry
    "before": {"STAGED_STORES": False, "Q_AFTER_INDICES": False},  # both, as before
    "bfirst": {"HEADS_FIRST": False},  # grid (B, head blocks, splits), as before
}
# ... and suffixes on a label (config changes): /p16 16-bit partials, /f32 fp32 partials.
WS_SUFFIXES = {"/p16": {"partial_dtype": "input"}, "/f32": {"partial_dtype": "fp32"}}


def _ws_variant(label: str) -> tuple[dict, dict]:
    """(module switches, config changes) of a split-trace variant label, e.g. direct/p16."""
    base, *sufs = label.split("/")
    if base not in WS_VARIANTS or any("/" + x not in WS_SUFFIXES for x in sufs):
        raise SystemExit(f"unknown variant {label!r}: one of {sorted(WS_VARIANTS)}, then any "
                         f"of {sorted(WS_SUFFIXES)}")  # fmt: skip
    cfg = {}
    for x in sufs:
        cfg.update(WS_SUFFIXES["/" + x])
    return WS_VARIANTS[base], cfg


def split_trace(args) -> None:
    from servelab.kernels.sparse_mla import gluon_ws as ws
    from servelab.kernels.sparse_mla.splitkv import (
        GLUON_WS,
        LAST_PATH,
        choose_num_splits,
        default_config,
        splitkv_decode,
    )

    drops = [""] + [d for d in args.drops.split(",") if d]
    labels = args.variants.split(",")
    variants = {lab: _ws_variant(lab) for lab in labels}
    saved = {k: getattr(ws, k) for v in WS_VARIANTS.values() for k in v}
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, times = [], collections.defaultdict(list)
    try:
        for name, shape, kv, scale, b, sets, ref in _cells(args):
            cfg = default_config(b, shape.heads, shape.d_qk, torch.bfloat16)
            if cfg.kernel != "ws":
                cfg = GLUON_WS
            if args.partials != "default":
                cfg = replace(cfg, partial_dtype=args.partials)
            ns = args.num_splits or choose_num_splits(b, shape.heads, shape.topk, cfg, n_sms)
            n_hblk = -(-shape.heads // cfg.block_h)
            n_tiles = -(-shape.topk // cfg.block_n)
            tps = -(-n_tiles // min(ns, n_tiles))
            n_local = torch.tensor([max(min(tps, n_tiles - s * tps), 0) for s in range(ns)])
            n_local = n_local.repeat(b * n_hblk)  # rows (b * n_hblk + hb) * ns + s
            for rnd in range(args.rounds):
                for label in labels:
                    switches, changes = variants[label]
                    for k, v in saved.items():
                        setattr(ws, k, switches.get(k, v))
                    vcfg = replace(cfg, **changes)
                    for drop in drops if rnd == 0 else [""]:
                        calls = [partial(splitkv_decode, q, kv, i, scale, shape.d_v, config=vcfg,
                                         num_splits=ns, drop=drop) for q, i in sets]  # fmt: skip
                        out, lse = calls[0]()
                        if LAST_PATH["split"] != "16bit_ws":
                            raise SystemExit(f"{name} B={b}: ran {LAST_PATH['split']}, not ws")
                        if not drop:  # (a diagnostic's results are wrong by design)
                            _check_reference(out, lse, ref, f"{name} B={b} {label}")
                        us = _graph_us(calls, args.reps)
                        if not drop:
                            times[(name, b, label)].append(us)
                        if rnd > 0:
                            continue
                        trace = torch.full((b * n_hblk * ns * ws.TRACE_COLS,), -1,
                                           dtype=torch.int64, device="cuda")  # fmt: skip
                        traced = [partial(c, trace=trace) for c in calls]
                        g = bsm.capture_graph(bsm.cycled(traced, bsm.MIN_GRAPH_CALLS))
                        for _ in range(3):
                            g.replay()
                        torch.cuda.synchronize()
                        del g
                        tr = trace.view(-1, ws.TRACE_COLS).cpu()
                        tag = f"{label}{'_' + drop if drop else ''}"
                        if args.out:
                            args.out.mkdir(parents=True, exist_ok=True)
                            torch.save({"trace": tr, "n_local": n_local, "shape": name, "b": b,
                                        "splits": ns, "drop": drop, "variant": label, "us": us},
                                       args.out / f"split_trace_{name}_b{b}_{tag.replace('/', '-')}.pt")  # fmt: skip
                        summ = _split_trace_summary(tr, n_local)
                        rows.append((name, b, ns, tag, us, summ))
                        print(f"{name:17} B={b:3} splits {ns:3} {tag:12} "
                              f"{LAST_PATH['split']}/{LAST_PATH['merge']}/{LAST_PATH['partials']} "
                              f"{us:7.2f} us  "
                              + " ".join(f"{k} {v:.2f}" for k, v in summ.items()), flush=True)  # fmt: skip
    finally:
        for k, v in saved.items():
            setattr(ws, k, v)
    print("\nws split kernel phases, us (round 0; medians over programs; span = first entry to "
          "the last store issued; call = the whole call's graph time)")  # fmt: skip
    print(f"{'shape':17} {'B':>3} {'S':>3} {'variant':12} {'call':>7} "
          + " ".join(f"{c:>12}" for c in SPLIT_TRACE_COLS))
    for name, b, ns, tag, us, summ in rows:
        print(f"{name:17} {b:3} {ns:3} {tag:12} {us:7.2f} "
              + " ".join(f"{summ[c]:12.2f}" for c in SPLIT_TRACE_COLS), flush=True)
    _rounds_table(args, labels, times, labels[0])


def grid_order(args) -> None:
    from servelab.kernels.sparse_mla import gluon_fp8, gluon_ws
    from servelab.kernels.sparse_mla.splitkv import LAST_PATH, splitkv_decode

    mods = (gluon_ws, gluon_fp8)
    saved = [m.HEADS_FIRST for m in mods]
    kinds = ["bf16"] + (["fp8"] if args.fp8 else [])
    labels = [f"{k}-{o}" for k in kinds for o in ("bfirst", "hfirst")]
    times = collections.defaultdict(list)
    if args.ncu:  # each order's default call twice (the first compiles), untimed, for ncu
        try:
            for name, shape, kv, scale, b, sets, _ in _cells(args, reference=False):
                for first in (False, True):
                    gluon_ws.HEADS_FIRST = first
                    for _ in range(2):
                        splitkv_decode(sets[0][0], kv, sets[0][1], scale, shape.d_v)
                    torch.cuda.synchronize()
                    print(f"{name} B={b} heads_first={first}: {LAST_PATH}", flush=True)
        finally:
            gluon_ws.HEADS_FIRST = saved[0]
        return
    try:
        for name, shape, kv, scale, b, sets, ref in _cells(args):
            cache = bsm.fp8_cache(shape, kv) if args.fp8 else None
            for kind in kinds:
                want = ref
                if kind == "fp8":  # the reference on the dequantised cache
                    q0, i0 = sets[0]
                    want = _fp8_reference(cache, kv, q0, i0, scale, shape.d_v)
                for first in (False, True):
                    for m in mods:
                        m.HEADS_FIRST = first
                    out, lse = splitkv_decode(sets[0][0], cache if kind == "fp8" else kv,
                                              sets[0][1], scale, shape.d_v)  # fmt: skip
                    _check_reference(out, lse, want, f"{name} B={b} {kind} heads_first={first}")
                    print(f"{name} B={b} {kind} heads_first={first}: {LAST_PATH}", flush=True)
            for _ in range(args.rounds):
                for label in labels:
                    kind, order = label.split("-")
                    for m in mods:
                        m.HEADS_FIRST = order == "hfirst"
                    calls = bsm.variant_calls("fp8" if kind == "fp8" else "splitkv", shape, sets,
                                              kv, cache=cache)  # fmt: skip
                    times[(name, b, label)].append(_graph_us(calls, args.reps))
            del cache
    finally:
        for m, v in zip(mods, saved, strict=True):
            m.HEADS_FIRST = v
    _rounds_table(args, labels, times, labels[0])


def once(args) -> None:
    from servelab.kernels.sparse_mla.splitkv import LAST_PATH, splitkv_decode

    for name, shape, kv, scale, b, sets, ref in _cells(args):
        q0, i0 = sets[0]
        kinds = [("bf16", kv, ref)]
        if args.fp8:
            cache = bsm.fp8_cache(shape, kv)
            want = _fp8_reference(cache, kv, q0, i0, scale, shape.d_v)
            kinds.append(("fp8", cache, want))
        for kind, cache_or_kv, want in kinds:
            for _ in range(2):
                out, lse = splitkv_decode(q0, cache_or_kv, i0, scale, shape.d_v)
            torch.cuda.synchronize()
            _check_reference(out, lse, want, f"{name} B={b} {kind}")
            print(f"{name} B={b} {kind}: {LAST_PATH}", flush=True)


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
                        "optionally +rw (partials rewritten by torch before the merge) and "
                        "/p16 (16-bit partials)")  # fmt: skip
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
                        f"{', '.join(WS_VARIANTS)}, each optionally followed by "
                        f"{', '.join(WS_SUFFIXES)} (16-bit or fp32 partials)")  # fmt: skip
    p.add_argument("--partials", choices=("default", "fp32", "input"), default="default",
                   help="the split's partial dtype (input: q's 16-bit dtype)")
    p.add_argument("--num-splits", type=int, default=None, help="split count (default: chosen)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", type=Path, default=None, help="save each raw trace here (.pt)")
    p = sub.add_parser("grid-order", help="the Gluon kernels' grid with B or the head blocks "
                       "first")  # fmt: skip
    p.add_argument("--shapes", default="v3.2,v4-pro")
    p.add_argument("--batches", default="64,128")
    p.add_argument("--fp8", action="store_true", help="also the FP8 cache's default")
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
     "graph-shape": graph_shape, "merge-trace": merge_trace,
     "split-trace": split_trace, "grid-order": grid_order, "once": once}[args.probe](args)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
