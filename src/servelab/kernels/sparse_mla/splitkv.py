"""Split-KV sparse MLA decode: heads on the MMA M dimension, selected tokens split across programs.

Grid (B, ceil(H / BLOCK_H), num_splits). Each program loads BLOCK_H query heads once, then for
each tile of BLOCK_N selected tokens gathers the rows once and feeds them to two tensor-core
dots (scores = Q K^T, then P V with V = the first d_v columns of the same rows), with an
online softmax in base 2. All heads of a head block share one gather, so a row is read
ceil(H / BLOCK_H) times per request instead of H times (and those reads mostly hit L2).

With num_splits > 1 each program writes a normalised partial (O_s [BLOCK_H, d_v], fp32 or
q's dtype per ``SplitConfig.partial_dtype``; lse_s [BLOCK_H] fp32) and merge.py merges them: lse = log sum_s exp(lse_s), O = sum_s exp(lse_s -
lse) O_s, either in a second kernel or in the split kernel itself (the last program of each
(request, head block), found with an atomic counter): ``SplitConfig.merge``. With
num_splits == 1 the first kernel writes the final output itself and no merge runs.

FP8 caches go to fp8_split.py (scales per column chunk) or, with ``fp8_chunked=False``, to
the first FP8 path kept here (dequantise the whole tile through a reshape); `default_config`
picks per shape and batch from the H200 measurements (neither is faster everywhere).

All-padding rows: out = 0, lse = -inf (a split that sees only padding writes O_s = 0,
lse_s = -inf, which the merge weighs with exp(-inf) = 0).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from . import merge as merge_mod
from . import splitkv_gluon, splitkv_gluon_fp8, splitkv_gluon_nh, splitkv_gluon_ws
from .fp8_split import MAX_CHUNKS, _sparse_mla_split_fp8_kernel
from .merge import fused_merge_epilogue, gdc_launch_dependents
from .reference import check_inputs
from .splitkv_config import (  # noqa: F401 - re-exported: the launch geometry lives there
    GLUON_KERNELS,
    GLUON_WIDE,
    GLUON_WS,
    MAX_SPLITS,
    NARROW,
    NARROW_RP,
    NARROW_TP,
    WIDE,
    SplitConfig,
    choose_num_splits,
    default_config,
    nh_config,
    resolve_merge,
)
from .splitkv_gluon import num_sms as _num_sms
from .splitkv_rp import _sparse_mla_split_rp_kernel

if TYPE_CHECKING:
    from .fp8 import Fp8KVCache

LOG2E = 1.4426950408889634

# The compiled kernels of the latest launch, for the benchmark's register/spill report.
LAST_COMPILED: dict[str, object] = {}
# Which paths the latest launch took (split kernel, merge, partials' dtype, heads x tokens per
# tile), for tests and logs.
LAST_PATH: dict[str, str] = {}


@triton.jit
def _load_fp8_tile(
    kv8_ptr, scale_ptr, rope_ptr, rows8, rows_s, rows_r, valid, offs_dv,
    D_V: tl.constexpr, D_FP8: tl.constexpr, SCALE_TILE: tl.constexpr, N_SCALES: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """Gather and dequantise value columns [0, BLOCK_DV) of BLOCK_N rows to fp32: e4m3 x the
    row's scale for its SCALE_TILE-column tile below D_FP8, the 16-bit part above."""
    is8 = offs_dv < D_FP8
    k8 = tl.load(kv8_ptr + rows8[:, None] + offs_dv[None, :],
                 mask=valid[:, None] & is8[None, :], other=0.0)  # fmt: skip
    offs_sc = tl.arange(0, N_SCALES)
    sc = tl.load(
        scale_ptr + rows_s[:, None] + offs_sc[None, :],
        mask=valid[:, None] & (offs_sc < D_FP8 // SCALE_TILE)[None, :],
        other=0.0,
    )
    kv3 = tl.reshape(k8.to(tl.float32), [BLOCK_N, N_SCALES, SCALE_TILE]) * sc[:, :, None]
    kv = tl.reshape(kv3, [BLOCK_N, BLOCK_DV])
    if D_FP8 < D_V:  # V4 layout: the last value columns are the 16-bit rope part
        kr = tl.load(rope_ptr + rows_r[:, None] + (offs_dv - D_FP8)[None, :],
                     mask=valid[:, None] & ((offs_dv >= D_FP8) & (offs_dv < D_V))[None, :],
                     other=0.0)  # fmt: skip
        kv = tl.where(is8[None, :], kv, kr.to(tl.float32))
    return kv


@triton.jit
def _sparse_mla_split_kernel(
    q_ptr,  # [B, H, D_qk]
    kv_ptr,  # [T, D_qk]; FP8: the e4m3 part [T, D_FP8]
    scale_ptr,  # FP8 only: [T, D_FP8 / SCALE_TILE] fp32 (else unused)
    rope_ptr,  # FP8 only: [T, D_qk - D_FP8] in q's dtype (else unused)
    idx_ptr,  # [B, topk] int32
    o_ptr,  # final [B, H, d_v] (SINGLE) or partial [B, S, H, d_v] fp32
    lse_ptr,  # final [B, H] or partial [B, S, H] fp32
    out_ptr,  # FUSED: final [B, H, d_v]
    flse_ptr,  # FUSED: final [B, H]
    cnt_ptr,  # FUSED: int32 counters, one per (request, head block), zero between calls
    H,
    topk,
    tiles_per_split,
    stride_qb,
    stride_qh,
    stride_kvt,
    stride_st,
    stride_rt,
    stride_ib,
    stride_ob,
    stride_os,
    stride_oh,
    stride_lb,
    stride_ls,
    stride_fob,
    stride_foh,
    stride_flb,
    scale_log2,
    D_V: tl.constexpr,
    D_TAIL: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_T: tl.constexpr,
    SINGLE: tl.constexpr,  # num_splits == 1: normalise and write the final output here
    F32_DOT: tl.constexpr,  # fp32 operands with IEEE dots (fp32 inputs; bf16 in the interpreter)
    DROP_QK: tl.constexpr,  # diagnostics: skip the score dot (scores = 0)
    DROP_PV: tl.constexpr,  # diagnostics: skip the P V dot
    PREFETCH_IDX: tl.constexpr,
    FP8: tl.constexpr,  # KV as e4m3 columns [0, D_FP8) x per-tile scales + 16-bit rest
    D_FP8: tl.constexpr,
    SCALE_TILE: tl.constexpr,
    N_SCALES: tl.constexpr,  # BLOCK_DV // SCALE_TILE (scales past D_FP8 are masked)
    FUSED: tl.constexpr,  # the last split program of each (request, head block) merges
    BLOCK_S: tl.constexpr,  # FUSED: next power of two >= num_splits
    PDL_TRIGGER: tl.constexpr,  # merge="pdl": let the merge kernel launch early
):
    if PDL_TRIGGER:
        gdc_launch_dependents()  # the merge kernel waits (griddepcontrol.wait) for our results
    b = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_dv = offs_dv < D_V
    offs_n0 = tl.arange(0, BLOCK_N)

    q_rows = q_ptr + b * stride_qb + offs_h[:, None] * stride_qh  # [BLOCK_H, 1]
    q = tl.load(q_rows + offs_dv[None, :], mask=mask_h[:, None] & mask_dv[None, :], other=0.0)
    if F32_DOT:
        q = q.to(tl.float32)
    if D_TAIL > 0:
        offs_t = tl.arange(0, BLOCK_T)
        mask_t = offs_t < D_TAIL
        q_tail = tl.load(
            q_rows + D_V + offs_t[None, :], mask=mask_h[:, None] & mask_t[None, :], other=0.0
        )
        if F32_DOT:
            q_tail = q_tail.to(tl.float32)

    m_i = tl.full([BLOCK_H], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    n_tiles = tl.cdiv(topk, BLOCK_N)
    t_start = sp * tiles_per_split
    t_end = tl.minimum(t_start + tiles_per_split, n_tiles)
    idx_row = idx_ptr + b * stride_ib
    if PREFETCH_IDX:
        offs_n = t_start * BLOCK_N + offs_n0
        n_lim = tl.minimum(topk, t_end * BLOCK_N)  # this split's slots end here
        idx_next = tl.load(idx_row + offs_n, mask=offs_n < n_lim, other=-1)
    for t in range(t_start, t_end):
        if PREFETCH_IDX:
            # The next tile's indices load while this tile computes, so the gather address is
            # ready at the top of the iteration instead of one dependent load later.
            idx = idx_next
            offs_n = (t + 1) * BLOCK_N + offs_n0
            idx_next = tl.load(idx_row + offs_n, mask=offs_n < n_lim, other=-1)
        else:
            offs_n = t * BLOCK_N + offs_n0
            idx = tl.load(idx_row + offs_n, mask=offs_n < topk, other=-1)
        valid = idx >= 0  # [BLOCK_N]
        rid = tl.where(valid, idx, 0).to(tl.int64)
        rows = rid * stride_kvt
        if FP8:
            kv = _load_fp8_tile(kv_ptr, scale_ptr, rope_ptr, rows, rid * stride_st,
                                rid * stride_rt, valid, offs_dv, D_V, D_FP8, SCALE_TILE,
                                N_SCALES, BLOCK_N, BLOCK_DV)  # fmt: skip
            kv = kv.to(tl.float32) if F32_DOT else kv.to(q_ptr.dtype.element_ty)
        else:
            if BLOCK_DV == D_V:  # real shapes: a row-constant mask keeps 16-byte vector loads
                kv_mask = valid[:, None]
            else:
                kv_mask = valid[:, None] & mask_dv[None, :]
            kv = tl.load(kv_ptr + rows[:, None] + offs_dv[None, :], mask=kv_mask, other=0.0)
            if F32_DOT:
                kv = kv.to(tl.float32)
        if DROP_QK:
            s = tl.zeros([BLOCK_H, BLOCK_N], dtype=tl.float32)
        else:
            if F32_DOT:
                s = tl.dot(q, tl.trans(kv), input_precision="ieee")  # [BLOCK_H, BLOCK_N]
            else:
                s = tl.dot(q, tl.trans(kv))
            if D_TAIL > 0:
                if FP8:  # the score-only tail lies in the 16-bit part
                    tail_ptrs = rope_ptr + (rid * stride_rt)[:, None] + (D_V - D_FP8)
                else:
                    tail_ptrs = kv_ptr + rows[:, None] + D_V
                kv_tail = tl.load(
                    tail_ptrs + offs_t[None, :], mask=valid[:, None] & mask_t[None, :], other=0.0
                )
                if F32_DOT:
                    s += tl.dot(q_tail, tl.trans(kv_tail.to(tl.float32)), input_precision="ieee")
                else:
                    s += tl.dot(q_tail, tl.trans(kv_tail))
        s = tl.where(valid[None, :], s * scale_log2, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # all padding so far: no NaN
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])  # [BLOCK_H, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        if not DROP_PV:
            if F32_DOT:
                acc = tl.dot(p, kv, acc, input_precision="ieee")
            else:
                acc = tl.dot(p.to(kv.dtype), kv, acc)
        m_i = m_new

    has_any = l_i > 0.0
    o = acc / tl.where(has_any, l_i, 1.0)[:, None]  # rows with nothing stay 0
    lse2 = m_i + tl.log2(l_i)  # -inf when l_i == 0
    lse = lse2 * 0.6931471805599453
    o_ptrs = o_ptr + b * stride_ob + sp * stride_os + offs_h[:, None] * stride_oh + offs_dv[None, :]
    o_mask = mask_h[:, None] & mask_dv[None, :]
    lse_ptrs = lse_ptr + b * stride_lb + sp * stride_ls + offs_h
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=o_mask)  # final, or fp32/16-bit partial
    tl.store(lse_ptrs, lse, mask=mask_h)
    if FUSED:
        fused_merge_epilogue(o_ptr, lse_ptr, out_ptr, flse_ptr, cnt_ptr, b, hb, H,
                             stride_ob, stride_os, stride_oh, stride_lb, stride_ls,
                             stride_fob, stride_foh, stride_flb,
                             D_V, BLOCK_H, BLOCK_DV, BLOCK_S)  # fmt: skip


def _fp8_chunkable(cache: Fp8KVCache, d_v: int) -> bool:
    """Whether fp8_split.py serves this layout (V3.2-like or V4-like, at most 8 chunks)."""
    d_rope = cache.d_qk - cache.d_fp8
    v32_like = cache.d_fp8 == d_v
    v4_like = cache.d_fp8 < d_v == cache.d_qk
    return (v32_like or v4_like) and cache.d_fp8 // cache.tile <= MAX_CHUNKS and d_rope > 0


def _gluon_module(kernel: str, fp8: bool):
    """The Gluon module a config's kernel names (None: a Triton kernel)."""
    if fp8:
        return {"gluon": splitkv_gluon_fp8, "nh": splitkv_gluon_nh}.get(kernel)
    return {"gluon": splitkv_gluon, "ws": splitkv_gluon_ws, "nh": splitkv_gluon_nh}.get(kernel)


def splitkv_decode(
    q: torch.Tensor,  # [B, H, D_qk]
    kv_cache: torch.Tensor | Fp8KVCache,  # [T, D_qk], or the FP8 layout of fp8.py
    indices: torch.Tensor,  # [B, topk] int32
    sm_scale: float,
    d_v: int,
    *,
    num_splits: int | None = None,
    config: SplitConfig | None = None,
    out: torch.Tensor | None = None,  # [B, H, d_v]
    lse: torch.Tensor | None = None,  # [B, H] fp32
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,  # partials; with num_splits
    drop: str = "",  # diagnostics only (wrong results): "qk"/"pv" skips that dot; Gluon
    # kernels: "gather" skips the loop's gathers, "dots" both dots, "dequant" (FP8) the
    # dequantisation into the staging tile
    trace: torch.Tensor | None = None,  # diagnostics: the ws kernel's phase stamps
    # (splitkv_gluon_ws.TRACE_LAYOUT); a launch that does not run that kernel raises
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the split kernel (and the merge kernel when num_splits > 1 and the config's
    merge is not "fused"); returns (out, lse)."""
    fp8 = not isinstance(kv_cache, torch.Tensor)
    if fp8:
        kv_main, scale, rope = kv_cache.data, kv_cache.scale, kv_cache.rope
        if rope.dtype != q.dtype:
            raise ValueError(f"FP8 cache's 16-bit part is {rope.dtype}, q is {q.dtype}")
        # Shape checks on a stand-in with the logical [T, D_qk] shape (no copy).
        b, h, d_qk, topk = check_inputs(q, rope.new_empty(1, 1).expand(rope.shape[0],
                                        kv_cache.d_qk), indices, d_v)  # fmt: skip
        if kv_cache.d_fp8 > d_v:
            raise ValueError(f"FP8 part ({kv_cache.d_fp8} columns) must lie within d_v={d_v}")
    else:
        b, h, d_qk, topk = check_inputs(q, kv_cache, indices, d_v)
        kv_main = scale = rope = kv_cache
    if q.stride(-1) != 1 or kv_main.stride(-1) != 1 or indices.stride(-1) != 1:
        raise ValueError("q, kv_cache and indices need a contiguous last dimension")
    cfg = config or default_config(b, h, d_qk, q.dtype, kv_cache.tile if fp8 else None,
                                   gluon=splitkv_gluon.gluon_device(q.device))  # fmt: skip
    asked_splits = num_splits
    for _ in range(2):  # a default Gluon config this launch cannot use: the tl default instead
        n_tiles = max(triton.cdiv(topk, cfg.block_n), 1)
        if asked_splits is None:
            num_splits = choose_num_splits(b, h, topk, cfg, _num_sms(q.device))
        if not 1 <= num_splits <= MAX_SPLITS:
            raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
        tiles_per_split = triton.cdiv(n_tiles, min(num_splits, n_tiles))
        gmod = _gluon_module(cfg.kernel, fp8)
        gluon = gmod is not None and gmod.serves(cfg, q, kv_cache, d_v, tiles_per_split, drop)
        if config is not None or cfg.kernel not in GLUON_KERNELS or gluon:
            break
        cfg = default_config(b, h, d_qk, q.dtype, kv_cache.tile if fp8 else None, gluon=False)

    # Splits past the last tile would see nothing; they still run and write (0, -inf).
    if out is None:
        out = torch.empty((b, h, d_v), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((b, h), dtype=torch.float32, device=q.device)
    interpreted = q.device.type == "cpu"
    f32_dot = q.dtype == torch.float32 or (interpreted and q.dtype == torch.bfloat16)
    single = num_splits == 1
    n_hblk = triton.cdiv(h, cfg.block_h)
    merge = resolve_merge(cfg, b, h, num_splits, _num_sms(q.device), q.device)
    cnt = None
    if merge == "fused":
        cnt = merge_mod.counters(q.device, b * n_hblk)
        merge = "fused" if cnt is not None else "kernel"  # growing it inside graph capture
    if single:
        o_dst, lse_dst = out, lse
        so = (out.stride(0), 0, out.stride(1))
        sl = (lse.stride(0), 0)
    else:
        if workspace is None:
            p_dtype = torch.float32 if cfg.partial_dtype == "fp32" else q.dtype
            workspace = (
                torch.empty((b, num_splits, h, d_v), dtype=p_dtype, device=q.device),
                torch.empty((b, num_splits, h), dtype=torch.float32, device=q.device),
            )
        o_dst, lse_dst = workspace
        if tuple(o_dst.shape) != (b, num_splits, h, d_v) or tuple(lse_dst.shape) != (
            b, num_splits, h,
        ) or o_dst.dtype not in (torch.float32, q.dtype) or lse_dst.dtype != torch.float32:  # fmt: skip
            raise ValueError("workspace must be ([B, S, H, d_v], [B, S, H]) (O fp32 or q's "
                             "dtype, lse fp32)")
        so = (o_dst.stride(0), o_dst.stride(1), o_dst.stride(2))
        sl = (lse_dst.stride(0), lse_dst.stride(1))
    fused = not single and merge == "fused"
    grid = (b, n_hblk, num_splits)
    block_dv = max(triton.next_power_of_2(d_v), 16)
    common = dict(
        BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, BLOCK_DV=block_dv, SINGLE=single, FUSED=fused,
        BLOCK_S=max(triton.next_power_of_2(num_splits), 2), F32_DOT=f32_dot,
        PREFETCH_IDX=cfg.prefetch_idx, PDL_TRIGGER=merge == "pdl" and not single,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    gluon = gluon and not fused
    if drop in splitkv_gluon.DROPS and drop and not gluon:
        raise ValueError(f"drop={drop!r} is a diagnostic of the Gluon kernel, which this launch "
                         "does not run (config, device or shape)")  # fmt: skip
    rp = not fp8 and not drop and not fused and cfg.kernel == "rp"
    if gluon and merge == "pdl":
        # The Gluon kernels do not trigger dependents. (A PDL merge after the ws kernel, its
        # programs starting as the split's exit, was no faster: H200, ninth follow-up.)
        merge = "kernel"
    if trace is not None and not (gluon and cfg.kernel == "ws" and not fp8):
        raise ValueError("trace is a diagnostic of the ws Gluon kernel, which this launch does "
                         "not run (config, device or shape)")  # fmt: skip
    if gluon:
        compiled = gmod.launch(
            cfg, grid, q, kv_cache, indices, o_dst, lse_dst, h, topk, tiles_per_split, so, sl,
            sm_scale, d_v, drop, **({"trace": trace} if trace is not None else {}))  # fmt: skip
        if compiled is None and trace is not None:
            raise RuntimeError("the ws Gluon kernel did not compile here, so it cannot be traced")
        if compiled is None and config is None:  # the default again: the tl kernel's geometry
            return splitkv_decode(q, kv_cache, indices, sm_scale, d_v, num_splits=asked_splits,
                                  out=out, lse=lse, drop=drop,
                                  workspace=workspace if asked_splits else None)  # fmt: skip
        gluon = compiled is not None
        if gluon:
            LAST_COMPILED["split"] = compiled
    chunked = bool(fp8 and not gluon and cfg.fp8_chunked and not drop
                   and _fp8_chunkable(kv_cache, d_v))  # fmt: skip
    if gluon:
        split = f"{'fp8' if fp8 else '16bit'}_{cfg.kernel}"  # e.g. fp8_gluon, 16bit_ws, fp8_nh
    elif fp8:
        split = "fp8_chunked" if chunked else "fp8_reshape"
    else:
        split = "16bit_rp" if rp else "16bit"
    LAST_PATH.update(split=split,
                     merge="single" if single else merge,
                     partials="" if single else str(o_dst.dtype).removeprefix("torch."),
                     tile=f"{cfg.block_h}x{cfg.block_n}")  # fmt: skip
    final = (out, lse, cnt if fused else lse)
    strides = (so[0], so[1], so[2], sl[0], sl[1], out.stride(0), out.stride(1), lse.stride(0))
    # (the leading arguments of the Triton split kernels, 16-bit and FP8)
    shared_args = (q, kv_main, scale, rope, indices, o_dst, lse_dst, *final, h, topk,
                   tiles_per_split, q.stride(0), q.stride(1), kv_main.stride(0), scale.stride(0),
                   rope.stride(0), indices.stride(0), *strides, sm_scale * LOG2E)  # fmt: skip
    try:
        if gluon:
            pass  # launched above, before LAST_PATH: a failed compile falls back to the tl kernel
        elif rp:
            d_tail = d_qk - d_v
            LAST_COMPILED["split"] = _sparse_mla_split_rp_kernel[grid](
                q, kv_main, indices, o_dst, lse_dst, h, topk, tiles_per_split,
                q.stride(0), q.stride(1), kv_main.stride(0), indices.stride(0),
                so[0], so[1], so[2], sl[0], sl[1], sm_scale * LOG2E,
                D_V=d_v, D_TAIL=d_tail, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, BLOCK_DV=block_dv,
                BLOCK_T=max(triton.next_power_of_2(max(d_tail, 1)), 16), F32_DOT=f32_dot,
                PDL_TRIGGER=common["PDL_TRIGGER"], num_warps=cfg.num_warps, num_stages=1,
            )  # fmt: skip
        elif chunked:
            d_rope = d_qk - kv_cache.d_fp8
            LAST_COMPILED["split"] = _sparse_mla_split_fp8_kernel[grid](
                *shared_args,
                D_V=d_v, D_FP8=kv_cache.d_fp8, CW=kv_cache.tile,
                N_CH=kv_cache.d_fp8 // kv_cache.tile, D_ROPE=d_rope,
                BLOCK_R=max(triton.next_power_of_2(d_rope), 16),
                ROPE_IN_V=kv_cache.d_fp8 < d_v,
                **common,
            )  # fmt: skip
        else:
            d_tail = d_qk - d_v
            tile = kv_cache.tile if fp8 else 16
            LAST_COMPILED["split"] = _sparse_mla_split_kernel[grid](
                *shared_args,
                D_V=d_v,
                D_TAIL=d_tail,
                BLOCK_T=max(triton.next_power_of_2(max(d_tail, 1)), 16),
                DROP_QK=drop == "qk",
                DROP_PV=drop == "pv",
                FP8=fp8,
                D_FP8=kv_cache.d_fp8 if fp8 else 0,
                SCALE_TILE=tile,
                N_SCALES=max(block_dv // tile, 1),
                **common,
            )  # fmt: skip
    except OutOfResources as e:
        # A Triton kernel on a geometry made for a Gluon kernel (an explicit Gluon config that
        # this launch could not serve, or whose compile failed) can need more shared memory
        # than the GPU has (the few-heads FP8 geometry on the Triton FP8 kernel: 264 KB at
        # V4-Flash's H 32 slice, H200): run the Triton default's own geometry instead. An
        # explicit Triton geometry that does not fit is the caller's to change.
        if cfg.kernel not in GLUON_KERNELS:
            raise ValueError(
                f"the split kernel's geometry (tiles {cfg.block_h}x{cfg.block_n}, "
                f"{cfg.num_stages} stages) needs more shared memory than this GPU has ({e}); "
                "use smaller tiles or fewer stages") from None  # fmt: skip
        tl_cfg = default_config(b, h, d_qk, q.dtype, kv_cache.tile if fp8 else None, gluon=False)
        warnings.warn(f"sparse MLA: the Triton kernel on the {cfg.kernel} config's geometry "
                      f"does not fit here ({e}); using the Triton default's",
                      stacklevel=2)  # fmt: skip
        return splitkv_decode(q, kv_cache, indices, sm_scale, d_v, num_splits=asked_splits,
                              config=tl_cfg, out=out, lse=lse, drop=drop,
                              workspace=workspace if asked_splits else None)  # fmt: skip
    if not single and not fused:
        LAST_COMPILED["combine"] = merge_mod.launch_merge((o_dst, lse_dst), out, lse,
                                                          pdl=merge == "pdl")  # fmt: skip
    return out, lse
