"""Split-KV sparse MLA decode over the FP8 cache of fp8.py, scales applied per column chunk.

Same grid, online softmax, partials and merge as triton_kernels/split.py. The difference is how a gathered
tile meets its per-tile scales. The first FP8 kernel dequantised each [rows x d_fp8] tile
through a reshape to [rows, tiles, tile]; Triton lowered that with a shared-memory layout
conversion (H200: shared memory 83 -> 182 KB per program, 255 registers, occupancy halved),
and FP8 ran at 0.33-0.93x of bf16. Here the e4m3 part is walked in its scale tiles (``CW``
columns each, constexpr-unrolled: 4 x 128 for V3.2's layout, 7 x 64 for V4's) and the scale,
one number per (row, chunk), is folded into the [H, rows] products instead of the values:

    scores  S  = Q_rope K_rope^T + sum_c (Q_c K_c^T) * scale_c[None, :]
    output  O_c = (P * scale_c[None, :]) V_c        (one accumulator per chunk)

K_c / V_c are the raw e4m3 values cast to the query dtype (exact: e4m3 fits in fp16 and bf16),
so each chunk is one load + one cast feeding both tensor-core dots, as the bf16 tile does.
P * scale_c is scaled by 2^8 before rounding to 16 bits (and the result by 2^-8, exact) so
that fp16 does not underflow for small-range tiles (scale = amax / 448).

Layouts served (others: the reshape path of triton_kernels/split.py):
V3.2-like, d_fp8 == d_v (the 16-bit part is the score-only tail); V4-like, d_fp8 < d_v == D_qk
(the 16-bit part is the last value columns). At most 8 chunks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from ..splitkv.merge import gdc_launch_dependents

if TYPE_CHECKING:
    from ..splitkv.lab import Lab
    from ..splitkv.plan import LaunchPlan

MAX_CHUNKS = 8
PV_SCALE = 256.0  # 2^8: keeps P * scale in fp16's normal range; removed exactly at the end


@triton.jit
def _chunk(kv8_ptr, scale_ptr, rows8, rows_s, valid, C: tl.constexpr, CW: tl.constexpr):
    """Raw e4m3 columns [C*CW, (C+1)*CW) of the tile's rows and their scale [BLOCK_N]."""
    offs = C * CW + tl.arange(0, CW)
    k = tl.load(kv8_ptr + rows8[:, None] + offs[None, :], mask=valid[:, None], other=0.0)
    sc = tl.load(scale_ptr + rows_s + C, mask=valid, other=0.0)
    return k, sc


@triton.jit
def _qchunk(q_rows, mask_h, C: tl.constexpr, CW: tl.constexpr, F32_DOT: tl.constexpr):
    q = tl.load(q_rows + C * CW + tl.arange(0, CW)[None, :], mask=mask_h[:, None], other=0.0)
    return q.to(tl.float32) if F32_DOT else q


@triton.jit
def _score(s, q_c, k_c, sc_c, F32_DOT: tl.constexpr):
    if F32_DOT:
        return s + tl.dot(q_c, tl.trans(k_c), input_precision="ieee") * sc_c[None, :]
    return s + tl.dot(q_c, tl.trans(k_c)) * sc_c[None, :]


@triton.jit
def _pv(acc, p, sc_c, k_c, alpha, F32_DOT: tl.constexpr):
    pw = p * (sc_c * 256.0)[None, :]  # PV_SCALE
    if F32_DOT:
        return tl.dot(pw, k_c, acc * alpha[:, None], input_precision="ieee")
    return tl.dot(pw.to(k_c.dtype), k_c, acc * alpha[:, None])


@triton.jit
def _store_cols(o_rows, acc, inv, mask_h, COL0: tl.constexpr, W: tl.constexpr,
                N_VALID: tl.constexpr):  # fmt: skip
    """Store acc * inv[:, None] [BLOCK_H, W] at columns [COL0, COL0 + min(W, N_VALID))."""
    offs = tl.arange(0, W)
    val = acc * inv[:, None]
    ptrs = o_rows + COL0 + offs[None, :]
    mask = mask_h[:, None] & (offs < N_VALID)[None, :]
    tl.store(ptrs, val.to(o_rows.dtype.element_ty), mask=mask)  # final, or the partial's dtype


@triton.jit
def _sparse_mla_split_fp8_kernel(
    q_ptr,  # [B, H, D_qk]
    kv8_ptr,  # [T, D_FP8] e4m3
    scale_ptr,  # [T, D_FP8 / CW] fp32
    rope_ptr,  # [T, D_ROPE] in q's dtype
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
    D_FP8: tl.constexpr,
    CW: tl.constexpr,  # columns per chunk = the layout's scale tile
    N_CH: tl.constexpr,  # D_FP8 // CW, 1..8
    D_ROPE: tl.constexpr,  # 16-bit columns after D_FP8
    BLOCK_R: tl.constexpr,  # next power of two >= D_ROPE
    ROPE_IN_V: tl.constexpr,  # V4 layout: the 16-bit columns are value columns too
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    SINGLE: tl.constexpr,
    F32_DOT: tl.constexpr,
    PREFETCH_IDX: tl.constexpr,
    PDL_TRIGGER: tl.constexpr,
):
    if PDL_TRIGGER:
        gdc_launch_dependents()  # let the merge kernel be scheduled; it waits for our results
    b = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < D_ROPE

    q_rows = q_ptr + b * stride_qb + offs_h[:, None] * stride_qh  # [BLOCK_H, 1]
    q_r = tl.load(q_rows + D_FP8 + offs_r[None, :], mask=mask_h[:, None] & mask_r[None, :],
                  other=0.0)  # fmt: skip
    q_r = q_r.to(tl.float32) if F32_DOT else q_r
    q0 = _qchunk(q_rows, mask_h, 0, CW, F32_DOT)
    q1 = _qchunk(q_rows, mask_h, 1, CW, F32_DOT) if N_CH > 1 else q0
    q2 = _qchunk(q_rows, mask_h, 2, CW, F32_DOT) if N_CH > 2 else q0
    q3 = _qchunk(q_rows, mask_h, 3, CW, F32_DOT) if N_CH > 3 else q0
    q4 = _qchunk(q_rows, mask_h, 4, CW, F32_DOT) if N_CH > 4 else q0
    q5 = _qchunk(q_rows, mask_h, 5, CW, F32_DOT) if N_CH > 5 else q0
    q6 = _qchunk(q_rows, mask_h, 6, CW, F32_DOT) if N_CH > 6 else q0
    q7 = _qchunk(q_rows, mask_h, 7, CW, F32_DOT) if N_CH > 7 else q0

    m_i = tl.full([BLOCK_H], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc_r = tl.zeros([BLOCK_H, BLOCK_R], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_H, CW], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_H, CW], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_H, CW], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_H, CW], dtype=tl.float32)
    acc4 = tl.zeros([BLOCK_H, CW], dtype=tl.float32)
    acc5 = tl.zeros([BLOCK_H, CW], dtype=tl.float32)
    acc6 = tl.zeros([BLOCK_H, CW], dtype=tl.float32)
    acc7 = tl.zeros([BLOCK_H, CW], dtype=tl.float32)
    n_tiles = tl.cdiv(topk, BLOCK_N)
    t_start = sp * tiles_per_split
    t_end = tl.minimum(t_start + tiles_per_split, n_tiles)
    idx_row = idx_ptr + b * stride_ib
    if PREFETCH_IDX:
        offs_n = t_start * BLOCK_N + offs_n0
        n_lim = tl.minimum(topk, t_end * BLOCK_N)
        idx_next = tl.load(idx_row + offs_n, mask=offs_n < n_lim, other=-1)
    for t in range(t_start, t_end):
        if PREFETCH_IDX:
            idx = idx_next
            offs_n = (t + 1) * BLOCK_N + offs_n0
            idx_next = tl.load(idx_row + offs_n, mask=offs_n < n_lim, other=-1)
        else:
            offs_n = t * BLOCK_N + offs_n0
            idx = tl.load(idx_row + offs_n, mask=offs_n < topk, other=-1)
        valid = idx >= 0  # [BLOCK_N]
        rid = tl.where(valid, idx, 0).to(tl.int64)
        rows8 = rid * stride_kvt
        rows_s = rid * stride_st
        k_r = tl.load(rope_ptr + (rid * stride_rt)[:, None] + offs_r[None, :],
                      mask=valid[:, None] & mask_r[None, :], other=0.0)  # fmt: skip
        k_r = k_r.to(tl.float32) if F32_DOT else k_r
        dt = k_r.dtype
        if F32_DOT:
            s = tl.dot(q_r, tl.trans(k_r), input_precision="ieee")  # [BLOCK_H, BLOCK_N]
        else:
            s = tl.dot(q_r, tl.trans(k_r))
        k0, c0 = _chunk(kv8_ptr, scale_ptr, rows8, rows_s, valid, 0, CW)
        k0 = k0.to(dt)
        s = _score(s, q0, k0, c0, F32_DOT)
        if N_CH > 1:
            k1, c1 = _chunk(kv8_ptr, scale_ptr, rows8, rows_s, valid, 1, CW)
            k1 = k1.to(dt)
            s = _score(s, q1, k1, c1, F32_DOT)
        if N_CH > 2:
            k2, c2 = _chunk(kv8_ptr, scale_ptr, rows8, rows_s, valid, 2, CW)
            k2 = k2.to(dt)
            s = _score(s, q2, k2, c2, F32_DOT)
        if N_CH > 3:
            k3, c3 = _chunk(kv8_ptr, scale_ptr, rows8, rows_s, valid, 3, CW)
            k3 = k3.to(dt)
            s = _score(s, q3, k3, c3, F32_DOT)
        if N_CH > 4:
            k4, c4 = _chunk(kv8_ptr, scale_ptr, rows8, rows_s, valid, 4, CW)
            k4 = k4.to(dt)
            s = _score(s, q4, k4, c4, F32_DOT)
        if N_CH > 5:
            k5, c5 = _chunk(kv8_ptr, scale_ptr, rows8, rows_s, valid, 5, CW)
            k5 = k5.to(dt)
            s = _score(s, q5, k5, c5, F32_DOT)
        if N_CH > 6:
            k6, c6 = _chunk(kv8_ptr, scale_ptr, rows8, rows_s, valid, 6, CW)
            k6 = k6.to(dt)
            s = _score(s, q6, k6, c6, F32_DOT)
        if N_CH > 7:
            k7, c7 = _chunk(kv8_ptr, scale_ptr, rows8, rows_s, valid, 7, CW)
            k7 = k7.to(dt)
            s = _score(s, q7, k7, c7, F32_DOT)
        s = tl.where(valid[None, :], s * scale_log2, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # all padding so far: no NaN
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])  # [BLOCK_H, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if ROPE_IN_V:  # unscaled 16-bit values: weight 2^8 like the chunks, removed at the end
            if F32_DOT:
                acc_r = tl.dot(p * 256.0, k_r, acc_r * alpha[:, None], input_precision="ieee")
            else:
                acc_r = tl.dot((p * 256.0).to(dt), k_r, acc_r * alpha[:, None])
        acc0 = _pv(acc0, p, c0, k0, alpha, F32_DOT)
        if N_CH > 1:
            acc1 = _pv(acc1, p, c1, k1, alpha, F32_DOT)
        if N_CH > 2:
            acc2 = _pv(acc2, p, c2, k2, alpha, F32_DOT)
        if N_CH > 3:
            acc3 = _pv(acc3, p, c3, k3, alpha, F32_DOT)
        if N_CH > 4:
            acc4 = _pv(acc4, p, c4, k4, alpha, F32_DOT)
        if N_CH > 5:
            acc5 = _pv(acc5, p, c5, k5, alpha, F32_DOT)
        if N_CH > 6:
            acc6 = _pv(acc6, p, c6, k6, alpha, F32_DOT)
        if N_CH > 7:
            acc7 = _pv(acc7, p, c7, k7, alpha, F32_DOT)
        m_i = m_new

    has_any = l_i > 0.0
    inv = (1.0 / 256.0) / tl.where(has_any, l_i, 1.0)  # rows with nothing stay 0
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453  # -inf when l_i == 0
    o_rows = o_ptr + b * stride_ob + sp * stride_os + offs_h[:, None] * stride_oh
    _store_cols(o_rows, acc0, inv, mask_h, 0, CW, CW)
    if N_CH > 1:
        _store_cols(o_rows, acc1, inv, mask_h, CW, CW, CW)
    if N_CH > 2:
        _store_cols(o_rows, acc2, inv, mask_h, 2 * CW, CW, CW)
    if N_CH > 3:
        _store_cols(o_rows, acc3, inv, mask_h, 3 * CW, CW, CW)
    if N_CH > 4:
        _store_cols(o_rows, acc4, inv, mask_h, 4 * CW, CW, CW)
    if N_CH > 5:
        _store_cols(o_rows, acc5, inv, mask_h, 5 * CW, CW, CW)
    if N_CH > 6:
        _store_cols(o_rows, acc6, inv, mask_h, 6 * CW, CW, CW)
    if N_CH > 7:
        _store_cols(o_rows, acc7, inv, mask_h, 7 * CW, CW, CW)
    if ROPE_IN_V:
        _store_cols(o_rows, acc_r, inv, mask_h, D_FP8, BLOCK_R, D_V - D_FP8)
    tl.store(lse_ptr + b * stride_lb + sp * stride_ls + offs_h, lse, mask=mask_h)


def serves(plan: LaunchPlan, lab: Lab) -> bool:
    """An FP8 cache of a layout this kernel reads: V3.2-like (e4m3 part = d_v) or V4-like
    (e4m3 + rope = d_v = D_qk), a rope part, at most MAX_CHUNKS scale tiles; no diagnostics."""
    p = plan.p
    if not p.fp8 or lab.drop:
        return False
    cache = p.kv
    d_rope = cache.d_qk - cache.d_fp8
    v32_like = cache.d_fp8 == p.d_v
    v4_like = cache.d_fp8 < p.d_v == cache.d_qk
    return (v32_like or v4_like) and cache.d_fp8 // cache.tile <= MAX_CHUNKS and d_rope > 0


def launch(plan: LaunchPlan, lab: Lab):
    """Launch the kernel; returns the compiled kernel (Triton errors propagate)."""
    p, cfg, cache = plan.p, plan.cfg, plan.p.kv
    so, sl = plan.so, plan.sl
    d_rope = p.d_qk - cache.d_fp8
    return _sparse_mla_split_fp8_kernel[plan.grid](
        p.q, cache.data, cache.scale, cache.rope, p.indices, plan.o_dst, plan.lse_dst, p.h,
        p.topk, plan.tiles_per_split, p.q.stride(0), p.q.stride(1), cache.data.stride(0),
        cache.scale.stride(0), cache.rope.stride(0), p.indices.stride(0),
        so[0], so[1], so[2], sl[0], sl[1], plan.scale_log2,
        D_V=p.d_v, D_FP8=cache.d_fp8, CW=cache.tile, N_CH=cache.d_fp8 // cache.tile,
        D_ROPE=d_rope, BLOCK_R=max(triton.next_power_of_2(d_rope), 16),
        ROPE_IN_V=cache.d_fp8 < p.d_v, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
        BLOCK_DV=plan.block_dv, SINGLE=plan.single, F32_DOT=p.f32_dot,
        PREFETCH_IDX=cfg.prefetch_idx, PDL_TRIGGER=plan.merge == "pdl",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
