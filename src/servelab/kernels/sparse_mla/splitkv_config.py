"""Launch geometry of the split-KV kernels: `SplitConfig`, the per-shape defaults measured on
the H200 (docs/performance.md, sparse MLA section), the merge choice and the split count."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton

from . import merge as merge_mod
from . import splitkv_gluon
from .merge import MERGES

MAX_SPLITS = 256  # the merge kernel loads all partials of a column slice at once
KERNELS = ("tl", "rp", "gluon", "ws", "nh")
GLUON_KERNELS = ("gluon", "ws", "nh")


@dataclass(frozen=True, slots=True)
class SplitConfig:
    """Launch geometry of the split kernel. Tile sizes and the split count set the order of
    the fp32 online-softmax accumulation and the merge, so two configs agree within the
    derived tolerance, not bit for bit; the tests check each against the exact result."""

    block_h: int = 64
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 2
    # Programs one SM holds at once with this geometry at the real shapes (compiler report on
    # the H200: 64-head tiles use 243-255 registers x 256 threads and 197-221 KB shared
    # memory -> 1; 16-head, 32-token tiles 128-191 registers x 128 threads, 50-93 KB -> 2+).
    ctas_per_sm: int = 1
    waves: float = 1.0  # target programs = waves x ctas_per_sm x SMs
    min_tiles_per_split: int = 1
    prefetch_idx: bool = True  # load tile t+1's indices during tile t
    # How partials are merged when num_splits > 1 (merge.py): "kernel" (second launch),
    # "pdl" (second launch, programmatic dependent), "fused" (last split program merges),
    # "auto" (pdl or kernel by how full the split grid is: `resolve_merge`).
    merge: str = "auto"
    # FP8 cache: per-chunk scales (fp8_split.py), else the reshape kernel. `default_config`
    # sets it per shape from the H200 measurements; a hand-made config keeps True, which was
    # 1.4-1.8x slower than the reshape kernel with 64-head tiles (registers spill).
    fp8_chunked: bool = True
    # Partial O of each split: fp32, or rounded to q's dtype ("input": half the partial bytes,
    # one extra rounding of u per partial). With the Triton and one-partition Gluon kernels,
    # timed on the H200 (2026-11-30, after the merge's column warps for 16-bit partials;
    # docs/performance.md, eighth follow-up): slower at 17 of 20 cells at B <= 8 (3 within 2%)
    # and at every mid-B cell timed, faster at three by 2.7-5.8%; so not their default. The
    # ws kernel stages its 16-bit stores and defaults to "input" (GLUON_WS).
    partial_dtype: str = "fp32"
    # Split kernel: "tl" (splitkv.py), "rp" (splitkv_rp.py: the next tile's gather issued into
    # registers before this tile's dots, num_stages unused), "gluon" (Hopper, 64-head tiles,
    # 8 warps, num_stages = ring depth: splitkv_gluon.py for a 16-bit cache,
    # splitkv_gluon_fp8.py for an FP8 one) or "ws" (splitkv_gluon_ws.py: Hopper, 16-bit cache,
    # loader / scorer / second-half partitions, num_stages = K buffers) or "nh"
    # (splitkv_gluon_nh.py: Hopper, all heads in one 16- or 32-head block on the wgmma N
    # dimension, 64-token tiles, 4 warps, 16-bit or FP8 cache, num_stages = ring depth). A
    # launch the chosen kernel cannot serve (fused merge, no Hopper GPU, other tiles, "rp" or
    # "ws" with an FP8 cache) runs a Triton kernel on the same geometry ("tl", or for an FP8
    # cache the per-chunk or reshape kernel by fp8_chunked); LAST_PATH["split"] says which ran.
    kernel: str = "tl"

    def __post_init__(self) -> None:
        for name in ("block_h", "block_n"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16 (tl.dot), got {v}")
        if self.merge not in MERGES:
            raise ValueError(f"merge must be one of {MERGES}, got {self.merge!r}")
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        if self.partial_dtype not in ("fp32", "input"):
            raise ValueError(f"partial_dtype must be 'fp32' or 'input', got {self.partial_dtype!r}")


# Chosen from the sweep on the H200 (docs/performance.md (sparse MLA section), 2026-11-29):
# - H >= 64 and B*H >= 1024: 64-head tiles, 64-token tiles, no index prefetch (V3.2 B=64:
#   163 us vs 246 us with prefetch; bn64 beats bn32 by 1.1-1.5x at B=64).
# - H >= 64, smaller B: 16-head tiles with more splits (V4-Flash B=1: 8.4 us vs 13.1 us for
#   64-head tiles; B=8: 15.0 vs 16.1).
# - H < 64 (TP slices): 16-head, 32-token tiles, 3 stages (H16 B=64: 53.5 us vs 69.8 us).
WIDE = SplitConfig(block_h=64, block_n=64, num_warps=8, num_stages=2, ctas_per_sm=1,
                   prefetch_idx=False)  # fmt: skip
NARROW = SplitConfig(block_h=16, block_n=32, num_warps=4, num_stages=2, ctas_per_sm=2)
NARROW_TP = SplitConfig(block_h=16, block_n=32, num_warps=4, num_stages=3, ctas_per_sm=2)


# PDL lets the merge kernel's programs be placed while the split kernel still runs; they then
# hold SM slots the split programs need. H200, 2026-11-29 (bench --compare, 20 cells at
# B <= 8): PDL won 1-8% wherever the split grid used <= 3/4 of the program slots
# (V4-Flash B=1 8.46 -> 8.08 us, H32 8.07 -> 7.41, H16 10.05 -> 9.37, V4-Pro 12.39 -> 11.81)
# and lost up to 4% at a full grid (V3.2 B=1, 256 programs: 14.90 -> 15.48).
# B > 8 was not measured with PDL, so "auto" keeps the two plain kernels there.
PDL_MAX_FILL = 0.75
PDL_MAX_B = 8


# The Gluon kernel (splitkv_gluon.py), H200 2026-11-29 (bench_sparse_mla_geometry,
# docs/performance.md): 64-token tiles, a 2-deep ring, 8 warps. Faster than the tl defaults at
# B >= 32 by 1.09-1.50x (V3.2, V4-Flash, V4-Pro, the H32 slice), and below that (two calls) at
# B = 8-16 by 1.06-1.43x and, with 128 heads, at B = 4 by 1.21-1.48x; slower at B = 4 with
# H <= 64 (by 1-4%) and on the H16 slice (75% of its 64-head tile is padding).
# GLUON_WS (splitkv_gluon_ws.py, warp-specialised), H200 2026-11-30 (calls 2-3, two machines):
# faster than GLUON_WIDE at every cell from B = 32 (1.01-1.34x: V4-Flash B = 128 48.1 -> 40.8-41.7
# us, V3.2 B = 64 110 -> 86-96, V4-Pro B = 128 137-139 -> 108-113) and within 1% or faster at
# B = 8; on the H16 slice (64-head tile, 75% padding) it also beats the tl kernel from B = 8
# (17.5 -> 15.2 us at B = 8; 93.1 -> 92.4 at B = 128). GLUON_WIDE stayed 1-2% faster at
# B = 8-15 with 32-64 heads until ws's staged 16-bit partials (ninth follow-up, below:
# V4-Flash B = 8 14.14 -> 12.17 us, H32 11.37 -> 11.23), so ws is now the 16-bit default from
# B = 8 (B = 2 with 128 heads) for every head count; GLUON_WIDE serves the FP8 cache.
# NARROW_RP: the register-prefetch kernel with 16-token tiles (more splits),
# faster only at B = 1 on the H16 slice (9.3 -> 7.9 us, five machines).
GLUON_WIDE = SplitConfig(block_h=64, block_n=64, num_warps=8, num_stages=2, ctas_per_sm=1,
                         prefetch_idx=False, kernel="gluon")  # fmt: skip
# Its partials are 16-bit (q's dtype) since it stores O through a free K buffer in whole row
# segments (splitkv_gluon_ws.STAGED_STORES): H200, 2026-11-30 (probes split-trace, three
# interleaved rounds, docs/performance.md ninth follow-up) V4-Flash B = 16 17.13 -> 13.35 us,
# B = 32 21.30 -> 17.93, B = 64 29.59 -> 25.65; V4-Pro B = 16 24.91 -> 20.99, B = 32 36.17 ->
# 31.46; V3.2 B = 16 34.86 -> 29.10, B = 32 53.00 -> 47.62; H32 B = 32 16.19 -> 15.29
# (B = 16: 12.67 -> 12.76, within noise). With fp32 partials the staged stores were not
# faster (they stay direct).
GLUON_WS = SplitConfig(block_h=64, block_n=64, num_warps=4, num_stages=2, ctas_per_sm=1,
                       prefetch_idx=False, kernel="ws", partial_dtype="input")  # fmt: skip
GLUON_MIN_B = 8
# From B = 2 with at least 128 heads: V4-Pro B = 2 13.64 -> 12.27 us with ws's 16-bit
# partials (H200, 2026-11-30, bench_sparse_mla_geometry --only default,ws; B = 1 stays with
# the tl kernel: 11.39 against 11.93). At 32-64 heads ws lost at B <= 2 (V4-Flash 9.35 vs
# 10.54 us at B = 2; ws's 64-token tiles allow 10 splits, the tl default's 20); at B = 4 it
# was 2.3% faster on V4-Flash (11.02 vs 11.28, one timing) and 13% slower on H32 (10.47 vs
# 9.24), so it starts at B = 8.
GLUON_MIN_B_WIDE, GLUON_WIDE_H = 2, 128
# ... and from B = 1 with 128 heads on V3.2's 576-wide rows (topk 2048): after the merge's
# 16K-element tiles (2026-11-30, bench_sparse_mla_geometry, two timings) ws ran V3.2 B = 1 in
# 12.60-12.77 us against the tl default's 13.62-13.75, B = 2 16.83-17.02 against 18.90-19.00;
# V4-Pro (512-wide rows, topk 1152) kept the tl default at B = 1 (11.06-11.39 against ws's
# 12.12-12.19) and tied at B = 2, so this stays with the measured row width.
GLUON_MIN_B_V32_D_QK = 576
# FP8 cache (splitkv_gluon_fp8.py: an FP8 ring dequantised once per tile into a 16-bit staging
# tile), H200 2026-11-30 (bench_sparse_mla_geometry --fp8, calls 1 and 4): faster than both FP8
# Triton kernels at every cell from B = 8 (all five shapes, B = 8, 32, 128: 1.09-2.94x), and
# below that from B = 1 with 128 heads (V4-Pro B = 1 24.6 -> 14.0 us, V3.2 18.5 -> 16.1), from
# B = 2 with 32-64 heads (V4-Flash B = 2 13.9 -> 12.9, B = 4 19.3 -> 13.2); slower at B = 1
# with 32-64 heads (10.6 vs 12.3) and at B <= 4 on the H16 slice (75% padding).
# The FP8 Gluon kernel with 16-bit partials (stored through its staging tile since the ninth
# follow-up), H200 2026-11-30 (bench_sparse_mla_geometry --fp8, fp8-p16 against fp8 in one
# call): V4-Flash B = 8 15.36 -> 13.91 us, B = 32 25.15 -> 23.06, B = 64 35.06 -> 32.80; V4-Pro
# B = 8 24.51 -> 22.49, B = 32 48.95 -> 48.39; V3.2 B = 8 30.64 -> 26.48, B = 32 75.82 ->
# 71.62. Not timed below B = 8, so fp32 partials stay there.
FP8_P16_MIN_B = 8
GLUON_FP8_P16 = replace(GLUON_WIDE, partial_dtype="input")


def gluon_fp8_min_b(h: int) -> int:
    """Smallest batch from which the FP8 default is the Gluon FP8 kernel, by head count."""
    if h >= 128:
        return 1
    return 2 if h >= 32 else 8


# The few-heads kernel (splitkv_gluon_nh.py: heads on the wgmma N dimension, for H <= 32), H200
# 2026-11-30 (bench_sparse_mla_geometry, two calls, docs/performance.md): with a 16-bit cache
# on the H16 slice faster than the previous defaults from B = 4 (1.06-1.14x: B = 16
# 21.4 -> 18.8 us, B = 128 91.8 -> 86.3), not at B <= 2 (before the merge's 16K tiles); at
# 32 heads within -2%..+4% of the ws / gluon defaults (kept). With the FP8 cache faster than
# the previous FP8 defaults from B = 2 on H16 (1.03-1.36x: B = 128 140 -> 103 us) and from
# B = 8 at 32 heads (1.03-1.13x: B = 128 50.8 -> 44.8 us).
# With the merge's 16K-element tiles (2026-11-30, bench_sparse_mla_geometry) nh also won on
# the H16 slice (V3.2's 576-wide rows) at B = 2: 9.38 us against the tl default's 10.67
# (B = 1: 8.69 against 7.67); other row widths were not timed at B = 2, so they keep B = 4.
# Fewer than 16 heads run the same 16-head tiles and grids in both kernels (masked heads).
NH_MIN_B = 4  # 16-bit cache, H <= 16
NH_MIN_B_V32 = 2  # ... on V3.2's rows (d_qk = GLUON_MIN_B_V32_D_QK)
NH_FP8_MIN_B = {16: 2, 32: 8}  # FP8 cache: heads (at most) -> smallest batch


def _nh_measured_faster(b: int, h: int, d_qk: int, fp8_tile: int | None) -> bool:
    """Whether the few-heads kernel is the Hopper default for this batch and head count."""
    if fp8_tile is None:
        return h <= 16 and b >= (NH_MIN_B_V32 if d_qk == GLUON_MIN_B_V32_D_QK else NH_MIN_B)
    if fp8_tile not in (64, 128) or h > 32:
        return False
    return b >= NH_FP8_MIN_B[16 if h <= 16 else 32]


def nh_config(h: int, num_stages: int = 2) -> SplitConfig:
    """The few-heads Gluon geometry for h <= 32 heads (one 16- or 32-head block)."""
    return SplitConfig(block_h=16 if h <= 16 else 32, block_n=64, num_warps=4,
                       num_stages=num_stages, ctas_per_sm=1, prefetch_idx=False,
                       kernel="nh")  # fmt: skip


NARROW_RP = SplitConfig(block_h=16, block_n=16, num_warps=4, num_stages=2, ctas_per_sm=2,
                        prefetch_idx=False, kernel="rp")  # fmt: skip


def default_config(b: int, h: int, d_qk: int, dtype: torch.dtype,
                   fp8_tile: int | None = None, *, gluon: bool | None = None) -> SplitConfig:  # fmt: skip
    """Config by batch and head count; ``fp8_tile`` (the FP8 cache's scale tile, None for a
    16-bit cache) picks the FP8 kernel. ``gluon``: whether the Gluon kernel may be chosen
    (None: if the current device can run it). d_qk picks the rules measured on V3.2's
    576-wide rows (ws from B = 1 at 128 heads, nh from B = 2 at <= 16 heads); dtype is kept
    for per-shape tables.

    On Hopper with at most 32 heads, the few-heads kernel where it was measured faster
    (NH_MIN_B, NH_MIN_B_V32, NH_FP8_MIN_B). FP8 on Hopper otherwise: the Gluon FP8 kernel from
    gluon_fp8_min_b(h). Below that, or without Gluon (H200, 2026-11-29, bench --compare):
    the per-chunk kernel beat the reshape kernel only
    with 16-head tiles on the V4 layout (64-column tiles) at B >= 2 (H32 B=16..128: 28.0 vs
    34.2 ... 146 vs 156 us; V4-Flash B=2..8: 14.3 vs 16.8 ... 27.1 vs 33.6); the reshape
    kernel won on V3.2's 128-column tiles (H16: 28.7 vs 31.3 us at B=16), with 64-head tiles
    (V4-Flash B=16: 26.7 vs 38.4; 222 spilled registers) and at B=1 (11.0 vs 13.4)."""
    gluon_b = GLUON_MIN_B_WIDE if h >= GLUON_WIDE_H else GLUON_MIN_B
    if h >= GLUON_WIDE_H and d_qk == GLUON_MIN_B_V32_D_QK:
        gluon_b = 1
    if _nh_measured_faster(b, h, d_qk, fp8_tile):
        if splitkv_gluon.gluon_device() if gluon is None else gluon:
            return nh_config(h)
    if fp8_tile is None and b >= gluon_b:
        if splitkv_gluon.gluon_device() if gluon is None else gluon:
            return GLUON_WS
    if fp8_tile in (64, 128) and b >= gluon_fp8_min_b(h):
        if splitkv_gluon.gluon_device() if gluon is None else gluon:
            return GLUON_FP8_P16 if b >= FP8_P16_MIN_B else GLUON_WIDE
    if h >= 64:
        cfg = WIDE if b * h >= 1024 else NARROW
    elif h <= 16 and b == 1 and fp8_tile is None:
        cfg = NARROW_RP
    else:
        cfg = NARROW_TP
    if fp8_tile is not None:
        return replace(cfg, fp8_chunked=cfg.block_h == 16 and fp8_tile <= 64 and b >= 2)
    return cfg


def resolve_merge(cfg: SplitConfig, b: int, h: int, num_splits: int, num_sms: int,
                  device: torch.device) -> str:  # fmt: skip
    """The merge a launch uses: "none" for one split; "auto" -> "pdl" when B <= PDL_MAX_B and
    the split grid (B x head blocks x splits) fills at most PDL_MAX_FILL of the program slots
    (ctas_per_sm x SMs), else "kernel"; "pdl" -> "kernel" where the device cannot
    (interpreter, before Hopper)."""
    if num_splits == 1:
        return "none"
    merge = cfg.merge
    if merge == "auto":
        fill = b * triton.cdiv(h, cfg.block_h) * num_splits / (cfg.ctas_per_sm * num_sms)
        merge = "pdl" if b <= PDL_MAX_B and fill <= PDL_MAX_FILL else "kernel"
    if merge == "pdl" and not merge_mod.pdl_supported(device):
        merge = "kernel"
    return merge


def choose_num_splits(b: int, h: int, topk: int, cfg: SplitConfig, num_sms: int) -> int:
    """Split count so that B x head-blocks x splits is about waves x ctas_per_sm x SMs.

    Never more splits than tiles (a split owns whole tiles), and 1 when the grid is already
    full without splitting (then the combine kernel is skipped).
    """
    n_hblk = triton.cdiv(h, cfg.block_h)
    n_tiles = max(triton.cdiv(topk, cfg.block_n), 1)
    base = b * n_hblk
    want = max(int(cfg.waves * cfg.ctas_per_sm * num_sms) // max(base, 1), 1)
    max_splits = max(n_tiles // cfg.min_tiles_per_split, 1)
    splits = min(want, max_splits, MAX_SPLITS)
    # Equalise: every split gets the same whole number of tiles, no empty trailing split.
    tiles_per_split = triton.cdiv(n_tiles, splits)
    return triton.cdiv(n_tiles, tiles_per_split)
