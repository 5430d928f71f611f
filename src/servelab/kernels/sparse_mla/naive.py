"""The (B, H) fallback: one program per (request, head), walking all selected tokens in tiles.

This is the pattern that took 63% of decode GPU time in the deployment servelab started from
(a Triton fallback with grid (B, H); docs/FIELD.md): at B=1 it
launches H programs on ~132 SMs, and every program gathers the same KV rows again (H reads of
each row per request) and reduces with CUDA-core FMAs. Kept as the baseline the split-KV
kernel is measured against; it is correct, not fast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .reference import check_inputs

LOG2E = 1.4426950408889634


@triton.jit
def _sparse_mla_naive_kernel(
    q_ptr,  # [B, H, D_qk]
    kv_ptr,  # [T, D_qk]
    idx_ptr,  # [B, topk] int32
    out_ptr,  # [B, H, d_v]
    lse_ptr,  # [B, H] fp32
    topk,
    stride_qb,
    stride_qh,
    stride_kvt,
    stride_ib,
    stride_ob,
    stride_oh,
    stride_lb,
    scale_log2,  # sm_scale * log2(e): the softmax runs in base 2
    D_V: tl.constexpr,
    D_TAIL: tl.constexpr,  # D_qk - d_v: score-only columns (the rope part of V3.2)
    BLOCK_N: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_dv = offs_dv < D_V
    q_row = q_ptr + b * stride_qb + h * stride_qh
    q = tl.load(q_row + offs_dv, mask=mask_dv, other=0.0).to(tl.float32)  # [BLOCK_DV]
    if D_TAIL > 0:
        offs_t = tl.arange(0, BLOCK_T)
        mask_t = offs_t < D_TAIL
        q_tail = tl.load(q_row + D_V + offs_t, mask=mask_t, other=0.0).to(tl.float32)

    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for start in range(0, topk, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_ptr + b * stride_ib + offs_n, mask=offs_n < topk, other=-1)
        valid = idx >= 0
        rows = tl.where(valid, idx, 0).to(tl.int64) * stride_kvt  # [BLOCK_N]
        k = tl.load(
            kv_ptr + rows[:, None] + offs_dv[None, :],
            mask=valid[:, None] & mask_dv[None, :],
            other=0.0,
        ).to(tl.float32)  # [BLOCK_N, BLOCK_DV]
        s = tl.sum(k * q[None, :], axis=1)  # [BLOCK_N]
        if D_TAIL > 0:
            k_tail = tl.load(
                kv_ptr + rows[:, None] + D_V + offs_t[None, :],
                mask=valid[:, None] & mask_t[None, :],
                other=0.0,
            ).to(tl.float32)
            s += tl.sum(k_tail * q_tail[None, :], axis=1)
        s = tl.where(valid, s * scale_log2, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        # While every slot so far is padding m_new is -inf; subtract 0 instead to avoid NaN.
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe)  # [BLOCK_N], 0 at padding
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * k, axis=0)
        m_i = m_new

    has_any = l_i > 0.0
    o = tl.where(has_any, acc / tl.where(has_any, l_i, 1.0), 0.0)
    tl.store(
        out_ptr + b * stride_ob + h * stride_oh + offs_dv,
        o.to(out_ptr.dtype.element_ty),
        mask=mask_dv,
    )
    # log2(0) = -inf, so an all-padding row gets lse = -inf without a branch.
    tl.store(lse_ptr + b * stride_lb + h, (m_i + tl.log2(l_i)) * 0.6931471805599453)


def naive_decode(
    q: torch.Tensor,  # [B, H, D_qk]
    kv_cache: torch.Tensor,  # [T, D_qk]
    indices: torch.Tensor,  # [B, topk] int32
    sm_scale: float,
    d_v: int,
    *,
    out: torch.Tensor | None = None,  # [B, H, d_v], q's dtype
    lse: torch.Tensor | None = None,  # [B, H] fp32
    block_n: int = 32,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the (B, H) kernel; returns (out, lse). Writes into out/lse when given."""
    out, lse, _ = naive_launch(q, kv_cache, indices, sm_scale, d_v, out=out, lse=lse,
                               block_n=block_n, num_warps=num_warps)  # fmt: skip
    return out, lse


def naive_launch(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    *,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    block_n: int = 32,
    num_warps: int = 4,
):
    """`naive_decode` also returning the compiled kernel (the benchmark's register report)."""
    b, h, d_qk, topk = check_inputs(q, kv_cache, indices, d_v)
    if q.stride(-1) != 1 or kv_cache.stride(-1) != 1 or indices.stride(-1) != 1:
        raise ValueError("q, kv_cache and indices need a contiguous last dimension")
    if out is None:
        out = torch.empty((b, h, d_v), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((b, h), dtype=torch.float32, device=q.device)
    d_tail = d_qk - d_v
    compiled = _sparse_mla_naive_kernel[(b, h)](
        q, kv_cache, indices, out, lse,
        topk,
        q.stride(0), q.stride(1), kv_cache.stride(0), indices.stride(0),
        out.stride(0), out.stride(1), lse.stride(0),
        sm_scale * LOG2E,
        D_V=d_v,
        D_TAIL=d_tail,
        BLOCK_N=block_n,
        BLOCK_DV=triton.next_power_of_2(d_v),
        BLOCK_T=max(triton.next_power_of_2(max(d_tail, 1)), 16),
        num_warps=num_warps,
    )  # fmt: skip
    return out, lse, compiled
