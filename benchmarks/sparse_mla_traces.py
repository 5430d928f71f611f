"""The sparse-MLA trace probes (bench_sparse_mla_probes.py's merge-trace, split-trace and
grid-order subcommands, and the helpers the probes share): where and when the merge's and the
ws split kernel's programs run, through lab.Lab options (the kernels' own stamps), never by
rewriting product modules."""

from __future__ import annotations

import collections
import re
import statistics
from dataclasses import replace
from functools import partial

import sparse_mla_common as bsm
import torch

POOL = 1 << 20  # KV rows, as in the benchmarks (1.1-1.2 GB: far beyond L2)


def _kv(shape: bsm.Shape, width: int | None = None) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(POOL, width or shape.d_qk, device="cuda").to(torch.bfloat16)


def _graph_us(calls, reps: int = 30) -> float:
    return bsm.summarize(bsm.time_graph(calls, reps))["us"]


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


# A merge geometry: "default", or any of, in this order: wN (warps), cN (d_v columns per
# program), capN (the default columns' cap in tile elements), kN (splits per unrolled step),
# cw / cw0 (warps along the columns or not, launch_merge's column_warps; its default is cw for
# 16-bit partials), e.g. "w2c256", "cap8192", "cw".
# A "/p16" suffix has the split write 16-bit partials (q's dtype), as --partials input does
# for every variant.
MERGE_VARIANT = re.compile(
    r"(?:default|(?=[wck])(?:w(\d+))?(?:c(\d+))?(?:cap(\d+))?(?:k(\d+))?(cw0?)?)"
)


def _merge_overrides(label: str) -> dict:
    label, p16 = label.removesuffix("/p16"), label.endswith("/p16")
    m = MERGE_VARIANT.fullmatch(label)
    sizes = [int(v) for v in m.groups()[:4] if v is not None] if m else []
    if m is None or any(v < 1 or v & (v - 1) for v in sizes):
        raise SystemExit(f"bad merge variant {label!r}: use default or, in this order, wN, cN, "
                         "capN, kN, cw or cw0 (e.g. w2c256, cap8192cw), then optionally "
                         "/p16; N a power of two")  # fmt: skip
    keys = ("num_warps", "block_dvc", "tile_elems", "s_chunk")
    out = {k: int(v) for k, v in zip(keys, m.groups()[:4], strict=True) if v}
    if m.group(5):
        out["column_warps"] = m.group(5) == "cw"
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


def merge_trace(args) -> None:
    from servelab.kernels.sparse_mla.dispatch.defaults import default_config
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.splitkv import merge as merge_mod
    from servelab.kernels.sparse_mla.splitkv.lab import Lab

    labels = args.variants.split(",")
    variants = {label: _merge_overrides(label) for label in labels}
    table = collections.defaultdict(list)
    for name, shape, kv, scale, b, sets, ref in _cells(args):
        for rnd in range(args.rounds):
            for label in labels:
                kw = dict(variants[label])
                p16 = kw.pop("p16", False)
                cfg = default_config(b, shape.heads, shape.d_qk)
                if p16 or args.partials != "default":
                    cfg = replace(cfg, partial_dtype="input" if p16 else args.partials)

                def calls_with(lab, cfg=cfg, kv=kv, scale=scale, d_v=shape.d_v, sets=sets):
                    return [partial(splitkv_launch, q, kv, i, scale, d_v, config=cfg,
                                    num_splits=args.num_splits, lab=lab) for q, i in sets]  # fmt: skip

                calls = calls_with(Lab(merge=kw))
                run = calls[0]()
                ran = run.ran
                if ran.merge == "single":
                    print(f"{name} B={b}: one split, no merge to trace")
                    break
                _check_reference(run.out, run.lse, ref, f"{name} B={b} {label}")
                us = _graph_us(calls, args.reps)
                table[(name, b, label)].append(us)
                line = ""
                if rnd == 0:
                    grid = merge_mod.merge_grid(
                        (b, ran.num_splits, shape.heads, shape.d_v), kw.get("block_dvc"),
                        kw.get("tile_elems", merge_mod.MERGE_TILE_ELEMS))[0]  # fmt: skip
                    trace = torch.zeros(4 * grid[0] * grid[1] * grid[2], dtype=torch.int64,
                                        device="cuda")  # fmt: skip
                    traced = calls_with(Lab(merge=dict(kw, trace=trace)))
                    g = bsm.capture_graph(bsm.cycled(traced, bsm.MIN_GRAPH_CALLS))
                    for _ in range(3):
                        g.replay()
                    torch.cuda.synchronize()
                    line = _trace_summary(trace.view(-1, 4).cpu())
                    del g
                print(f"round {rnd} {name:17} B={b:3} merge {label:8} "
                      f"{ran.merge:6} {ran.partials:8} {us:7.2f} us  {line}", flush=True)  # fmt: skip
            else:
                continue
            break
    _rounds_table(args, labels, table, "default")


def _split_trace_summary(tr: torch.Tensor, n_local: torch.Tensor) -> dict:
    """Phase times of one traced ws launch, us: the medians over programs, and over their tiles
    for the per-tile steps (torch's median: the lower middle value); "span" and
    "entry_spread" from the first entry to the last store / the last entry.
    tr: [programs, TRACE_COLS] int64 (-1 where unstamped); n_local: tiles per program."""
    from servelab.kernels.sparse_mla.gluon_kernels.ws import TRACE_LAYOUT as L
    from servelab.kernels.sparse_mla.gluon_kernels.ws import TRACE_TILES

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


# split-trace variants: label -> the gluon_ws switches (lab.Lab fields) they set.
WS_VARIANTS = {
    "default": {},
    "direct": {"staged_stores": False},  # O stored from the accumulator's layout
    "qearly": {"q_after_indices": False},  # q's copies issued at entry
    "before": {"staged_stores": False, "q_after_indices": False},  # both, as before
    "bfirst": {"heads_first": False},  # grid (B, head blocks, splits), as before
}
# ... and suffixes on a label (config changes): /p16 16-bit partials, /f32 fp32 partials.
WS_SUFFIXES = {"/p16": {"partial_dtype": "input"}, "/f32": {"partial_dtype": "fp32"}}


def _ws_variant(label: str) -> tuple[dict, dict]:
    """(lab switches, config changes) of a split-trace variant label, e.g. direct/p16."""
    base, *sufs = label.split("/")
    if base not in WS_VARIANTS or any("/" + x not in WS_SUFFIXES for x in sufs):
        raise SystemExit(f"unknown variant {label!r}: one of {sorted(WS_VARIANTS)}, then any "
                         f"of {sorted(WS_SUFFIXES)}")  # fmt: skip
    cfg = {}
    for x in sufs:
        cfg.update(WS_SUFFIXES["/" + x])
    return WS_VARIANTS[base], cfg


def split_trace(args) -> None:
    from servelab.kernels.sparse_mla.dispatch.defaults import default_config, geometry
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.gluon_kernels import ws
    from servelab.kernels.sparse_mla.splitkv.geometry import choose_num_splits
    from servelab.kernels.sparse_mla.splitkv.lab import Lab

    drops = [""] + [d for d in args.drops.split(",") if d]
    labels = args.variants.split(",")
    variants = {lab: _ws_variant(lab) for lab in labels}
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, times = [], collections.defaultdict(list)
    for name, shape, kv, scale, b, sets, ref in _cells(args):
        cfg = default_config(b, shape.heads, shape.d_qk)
        if cfg.kernel != "gluon_ws":
            cfg = geometry("gluon_ws")
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
                vcfg = replace(cfg, **changes)
                for drop in drops if rnd == 0 else [""]:
                    def calls_with(trace=None, drop=drop, switches=switches, vcfg=vcfg, kv=kv,
                                   scale=scale, d_v=shape.d_v, ns=ns, sets=sets):  # fmt: skip
                        lab = Lab(drop=drop, trace=trace, **switches)
                        return [partial(splitkv_launch, q, kv, i, scale, d_v, config=vcfg,
                                        num_splits=ns, lab=lab) for q, i in sets]  # fmt: skip

                    calls = calls_with()
                    run = calls[0]()  # (a named config: gluon_ws runs, or this raises)
                    ran = run.ran
                    if not drop:  # (a diagnostic's results are wrong by design)
                        _check_reference(run.out, run.lse, ref, f"{name} B={b} {label}")
                    us = _graph_us(calls, args.reps)
                    if not drop:
                        times[(name, b, label)].append(us)
                    if rnd > 0:
                        continue
                    trace = torch.full((b * n_hblk * ns * ws.TRACE_COLS,), -1,
                                       dtype=torch.int64, device="cuda")  # fmt: skip
                    traced = calls_with(trace)
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
                          f"{ran.variant}/{ran.merge}/{ran.partials} "
                          f"{us:7.2f} us  "
                          + " ".join(f"{k} {v:.2f}" for k, v in summ.items()), flush=True)  # fmt: skip
    print("\nws split kernel phases, us (round 0; medians over programs; span = first entry to "
          "the last store issued; call = the whole call's graph time)")  # fmt: skip
    print(f"{'shape':17} {'B':>3} {'S':>3} {'variant':12} {'call':>7} "
          + " ".join(f"{c:>12}" for c in SPLIT_TRACE_COLS))
    for name, b, ns, tag, us, summ in rows:
        print(f"{name:17} {b:3} {ns:3} {tag:12} {us:7.2f} "
              + " ".join(f"{summ[c]:12.2f}" for c in SPLIT_TRACE_COLS), flush=True)
    _rounds_table(args, labels, times, labels[0])


def grid_order(args) -> None:
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.splitkv.lab import Lab

    labels = ["bf16-bfirst", "bf16-hfirst"]
    times = collections.defaultdict(list)
    for name, shape, kv, scale, b, sets, ref in _cells(args, reference=not args.ncu):
        for first in (False, True):
            lab = Lab(heads_first=first)
            for _ in range(2 if args.ncu else 1):  # (--ncu: the first compiles)
                run = splitkv_launch(sets[0][0], kv, sets[0][1], scale, shape.d_v, lab=lab)
            torch.cuda.synchronize()
            if not args.ncu:
                _check_reference(run.out, run.lse, ref, f"{name} B={b} heads_first={first}")
            print(f"{name} B={b} heads_first={first}: {run.ran}", flush=True)
        if args.ncu:
            continue
        for _ in range(args.rounds):
            for label in labels:
                lab = Lab(heads_first=label.endswith("hfirst"))
                calls = bsm.variant_calls("splitkv", shape, sets, kv, lab=lab)
                times[(name, b, label)].append(_graph_us(calls, args.reps))
    if not args.ncu:
        _rounds_table(args, labels, times, labels[0])
