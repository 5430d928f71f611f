"""Split-KV sparse MLA decode with the next tile's gather issued before this tile's dots.

Same grid, online softmax, partials and merge as triton_kernels/split.py (16-bit KV only). The difference
is where a tile's gather sits in the loop. In triton_kernels/split.py, Triton's software pipeliner puts the
cp.async gather of tile t+1 at the end of iteration t (after both dots are issued) and waits
for it at the top of iteration t+1 (`async_wait num = 0` in the TTGIR, Triton 3.6): with one
program per SM, each tile's gather latency is exposed, and only the asynchronous P V dot runs
under it. Here the loop is pipelined by hand, one tile deep, through registers:

    prologue:  rows(t0) -> kv_regs = gather(t0); idx(t0 + 1)
    iteration t:  kv = kv_regs                  (to shared memory for the two dots)
                  kv_regs = gather(t + 1)       (plain loads: in flight during this tile)
                  idx(t + 2)                    (indices two tiles ahead, so the address of
                                                 the next gather is ready without a wait)
                  S = Q K^T, softmax, O += P V

The loads are ordinary `ld.global` into registers (no pipeliner: num_stages = 1), so a tile's
rows arrive while the previous tile computes; the price is the registers holding the tile in
flight (BLOCK_N x D_qk x 2 B over the program's threads: 64 per thread for a 32-row tile of
512 columns and 8 warps), which is why this kernel uses 32-row tiles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from ..splitkv.merge import gdc_launch_dependents

if TYPE_CHECKING:
    from ..splitkv.lab import Lab
    from ..splitkv.plan import LaunchPlan


@triton.jit
def _gather(kv_ptr, idx, offs_dv, offs_t, D_V: tl.constexpr, D_TAIL: tl.constexpr,
            stride_kvt, BLOCK_DV: tl.constexpr):  # fmt: skip
    valid = idx >= 0
    rows = tl.where(valid, idx, 0).to(tl.int64) * stride_kvt
    if BLOCK_DV == D_V:
        kv = tl.load(kv_ptr + rows[:, None] + offs_dv[None, :], mask=valid[:, None], other=0.0)
    else:
        kv = tl.load(kv_ptr + rows[:, None] + offs_dv[None, :],
                     mask=valid[:, None] & (offs_dv < D_V)[None, :], other=0.0)  # fmt: skip
    if D_TAIL > 0:
        tail = tl.load(kv_ptr + rows[:, None] + D_V + offs_t[None, :],
                       mask=valid[:, None] & (offs_t < D_TAIL)[None, :], other=0.0)  # fmt: skip
    else:
        tail = kv  # unused
    return kv, tail


@triton.jit
def _sparse_mla_split_rp_kernel(
    q_ptr,  # [B, H, D_qk]
    kv_ptr,  # [T, D_qk]
    idx_ptr,  # [B, topk] int32
    o_ptr,  # final [B, H, d_v] (SINGLE) or partial [B, S, H, d_v]
    lse_ptr,  # final [B, H] or partial [B, S, H] fp32
    H,
    topk,
    tiles_per_split,
    stride_qb,
    stride_qh,
    stride_kvt,
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
    F32_DOT: tl.constexpr,  # fp32 operands with IEEE dots (fp32 inputs; bf16 in the interpreter)
    PDL_TRIGGER: tl.constexpr,
):
    if PDL_TRIGGER:
        gdc_launch_dependents()
    b = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_dv = offs_dv < D_V
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_t = tl.arange(0, BLOCK_T)

    n_tiles = tl.cdiv(topk, BLOCK_N)
    t_start = sp * tiles_per_split
    t_end = tl.minimum(t_start + tiles_per_split, n_tiles)
    n_lim = tl.minimum(topk, t_end * BLOCK_N)  # this split's slots end here
    idx_row = idx_ptr + b * stride_ib

    # Prologue: the first tile's rows are requested before q, so both are in flight together.
    offs_n = t_start * BLOCK_N + offs_n0
    idx_cur = tl.load(idx_row + offs_n, mask=offs_n < n_lim, other=-1)
    kv_next, tail_next = _gather(kv_ptr, idx_cur, offs_dv, offs_t, D_V, D_TAIL, stride_kvt,
                                 BLOCK_DV)  # fmt: skip
    offs_n = offs_n + BLOCK_N
    idx_next = tl.load(idx_row + offs_n, mask=offs_n < n_lim, other=-1)

    q_rows = q_ptr + b * stride_qb + offs_h[:, None] * stride_qh
    q = tl.load(q_rows + offs_dv[None, :], mask=mask_h[:, None] & mask_dv[None, :], other=0.0)
    if F32_DOT:
        q = q.to(tl.float32)
    if D_TAIL > 0:
        q_tail = tl.load(q_rows + D_V + offs_t[None, :],
                         mask=mask_h[:, None] & (offs_t < D_TAIL)[None, :], other=0.0)  # fmt: skip
        if F32_DOT:
            q_tail = q_tail.to(tl.float32)

    m_i = tl.full([BLOCK_H], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    for _t in range(t_start, t_end):
        kv = kv_next
        valid = idx_cur >= 0
        if F32_DOT:
            kv = kv.to(tl.float32)
            s = tl.dot(q, tl.trans(kv), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(kv))
        if D_TAIL > 0:
            if F32_DOT:
                s += tl.dot(q_tail, tl.trans(tail_next.to(tl.float32)), input_precision="ieee")
            else:
                s += tl.dot(q_tail, tl.trans(tail_next))
        # The score dot has taken this tile to shared memory; its registers now receive the
        # next tile's gather (masked off past this split: no traffic) and the indices of the
        # one after, which land while the softmax, the P V dot and the next score dot run.
        idx_cur = idx_next
        kv_next, tail_next = _gather(kv_ptr, idx_cur, offs_dv, offs_t, D_V, D_TAIL, stride_kvt,
                                     BLOCK_DV)  # fmt: skip
        offs_n = offs_n + BLOCK_N
        idx_next = tl.load(idx_row + offs_n, mask=offs_n < n_lim, other=-1)
        s = tl.where(valid[None, :], s * scale_log2, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # all padding so far: no NaN
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        if F32_DOT:
            acc = tl.dot(p, kv, acc, input_precision="ieee")
        else:
            acc = tl.dot(p.to(kv.dtype), kv, acc)
        m_i = m_new

    has_any = l_i > 0.0
    o = acc / tl.where(has_any, l_i, 1.0)[:, None]  # rows with nothing stay 0
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453  # -inf when l_i == 0
    o_ptrs = o_ptr + b * stride_ob + sp * stride_os + offs_h[:, None] * stride_oh + offs_dv[None, :]
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=mask_h[:, None] & mask_dv[None, :])
    tl.store(lse_ptr + b * stride_lb + sp * stride_ls + offs_h, lse, mask=mask_h)


def serves(plan: LaunchPlan, lab: Lab) -> bool:
    """A 16-bit cache, any geometry (num_stages unused); no diagnostics."""
    return not plan.p.fp8 and not lab.drop


def launch(plan: LaunchPlan, lab: Lab):
    """Launch the kernel; returns the compiled kernel (Triton errors propagate)."""
    p, cfg = plan.p, plan.cfg
    so, sl = plan.so, plan.sl
    return _sparse_mla_split_rp_kernel[plan.grid](
        p.q, p.kv, p.indices, plan.o_dst, plan.lse_dst, p.h, p.topk, plan.tiles_per_split,
        p.q.stride(0), p.q.stride(1), p.kv.stride(0), p.indices.stride(0),
        so[0], so[1], so[2], sl[0], sl[1], plan.scale_log2,
        D_V=p.d_v, D_TAIL=p.d_tail, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
        BLOCK_DV=plan.block_dv, BLOCK_T=max(triton.next_power_of_2(max(p.d_tail, 1)), 16),
        F32_DOT=p.f32_dot, PDL_TRIGGER=plan.merge == "pdl", num_warps=cfg.num_warps,
        num_stages=1,
    )  # fmt: skip
