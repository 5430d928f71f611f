"""The Triton split-KV kernel ("triton"): heads on the MMA M dimension, selected tokens split
across programs, a 16-bit cache or the FP8 layout dequantised through a reshape.

Grid (B, ceil(H / BLOCK_H), num_splits). Each program loads BLOCK_H query heads once, then for
each tile of BLOCK_N selected tokens gathers the rows once and feeds them to two tensor-core
dots (scores = Q K^T, then P V with V = the first d_v columns of the same rows), with an
online softmax in base 2. All heads of a head block share one gather, so a row is read
ceil(H / BLOCK_H) times per request instead of H times (and those reads mostly hit L2).

With num_splits > 1 each program writes a normalised partial (O_s [BLOCK_H, d_v], fp32 or
q's dtype per ``SplitConfig.partial_dtype``; lse_s [BLOCK_H] fp32) and splitkv/merge.py merges them;
with one split the kernel writes the final output itself. An FP8 cache (fp8.py) is read with
``FP8=True``: each gathered tile is dequantised to q's dtype in registers through a reshape
to [rows, tiles, tile] (triton_kernels/fp8_chunked.py is the per-chunk-scale alternative). All-padding rows:
out = 0, lse = -inf (a split that sees only padding writes O_s = 0, lse_s = -inf, which the
merge weighs with exp(-inf) = 0). Runs on any CUDA GPU and in the CPU interpreter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from ..splitkv.merge import gdc_launch_dependents

if TYPE_CHECKING:
    from ..splitkv.lab import Lab
    from ..splitkv.plan import LaunchPlan

DROPS = ("", "qk", "pv")  # the lab diagnostics this kernel implements


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
    scale_log2,
    D_V: tl.constexpr,
    D_TAIL: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_T: tl.constexpr,
    SINGLE: tl.constexpr,  # num_splits == 1: normalise and write the final output here
    F32_DOT: tl.constexpr,  # fp32 operands with IEEE dots (fp32 inputs; bf16 in the interpreter)
    DROP_QK: tl.constexpr,  # lab.Lab(drop="qk"): skip the score dot (scores = 0)
    DROP_PV: tl.constexpr,  # lab.Lab(drop="pv"): skip the P V dot
    PREFETCH_IDX: tl.constexpr,
    FP8: tl.constexpr,  # KV as e4m3 columns [0, D_FP8) x per-tile scales + 16-bit rest
    D_FP8: tl.constexpr,
    SCALE_TILE: tl.constexpr,
    N_SCALES: tl.constexpr,  # BLOCK_DV // SCALE_TILE (scales past D_FP8 are masked)
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


def serves(plan: LaunchPlan, lab: Lab) -> bool:
    """Any split geometry on any device, either cache; not the Gluon-only diagnostics."""
    return lab.drop in DROPS


def launch(plan: LaunchPlan, lab: Lab):
    """Launch the kernel; returns the compiled kernel (Triton errors propagate)."""
    p, cfg = plan.p, plan.cfg
    if p.fp8:
        kv_main, scale, rope, tile, d_fp8 = p.kv.data, p.kv.scale, p.kv.rope, p.kv.tile, p.kv.d_fp8
    else:
        kv_main = scale = rope = p.kv
        tile, d_fp8 = 16, 0
    so, sl = plan.so, plan.sl
    return _sparse_mla_split_kernel[plan.grid](
        p.q, kv_main, scale, rope, p.indices, plan.o_dst, plan.lse_dst, p.h, p.topk,
        plan.tiles_per_split, p.q.stride(0), p.q.stride(1), kv_main.stride(0), scale.stride(0),
        rope.stride(0), p.indices.stride(0), so[0], so[1], so[2], sl[0], sl[1],
        plan.scale_log2,
        D_V=p.d_v, D_TAIL=p.d_tail, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
        BLOCK_DV=plan.block_dv, BLOCK_T=max(triton.next_power_of_2(max(p.d_tail, 1)), 16),
        SINGLE=plan.single, F32_DOT=p.f32_dot, DROP_QK=lab.drop == "qk",
        DROP_PV=lab.drop == "pv", PREFETCH_IDX=cfg.prefetch_idx, FP8=p.fp8, D_FP8=d_fp8,
        SCALE_TILE=tile, N_SCALES=max(plan.block_dv // tile, 1),
        PDL_TRIGGER=plan.merge == "pdl", num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
