"""Plain PyTorch sparse MLA decode: the definition every kernel is tested against.

Semantics shared by all variants (the kernels document only where they differ):

- Each request b attends to the rows ``kv_cache[indices[b, j]]`` for every list slot j with
  ``indices[b, j] >= 0``; ``-1`` marks padding and contributes nothing.
- Duplicate indices are separate softmax terms: a row listed twice is weighted twice (the
  kernels walk the list, they do not de-duplicate it).
- ``lse[b, h]`` is the natural-log log-sum-exp of the scaled scores ``sm_scale * q . k``.
- A request whose slots are all padding has ``out = 0`` and ``lse = -inf`` (no NaN).
"""

from __future__ import annotations

import torch


def check_inputs(
    q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, d_v: int
) -> tuple[int, int, int, int]:
    """Validate shapes and dtypes shared by all variants; return (B, H, D_qk, topk).

    Raises ValueError naming the offending argument: the launchers are called by engine code,
    not by users, so a programming error should surface with a precise message.
    """
    if q.dim() != 3:
        raise ValueError(f"q must be [B, H, D_qk], got shape {tuple(q.shape)}")
    if kv_cache.dim() != 2:
        raise ValueError(f"kv_cache must be [T, D_qk], got shape {tuple(kv_cache.shape)}")
    if indices.dim() != 2:
        raise ValueError(f"indices must be [B, topk], got shape {tuple(indices.shape)}")
    b, h, d_qk = q.shape
    if kv_cache.shape[1] != d_qk:
        raise ValueError(f"kv_cache has D_qk={kv_cache.shape[1]} but q has D_qk={d_qk}")
    if indices.shape[0] != b:
        raise ValueError(f"indices has B={indices.shape[0]} but q has B={b}")
    if indices.dtype != torch.int32:
        raise ValueError(f"indices must be int32, got {indices.dtype}")
    if not 0 < d_v <= d_qk:
        raise ValueError(f"d_v must be in (0, D_qk={d_qk}], got {d_v}")
    if q.device != kv_cache.device or q.device != indices.device:
        raise ValueError("q, kv_cache and indices must be on one device")
    return b, h, d_qk, indices.shape[1]


def sparse_mla_decode_reference(
    q: torch.Tensor,  # [B, H, D_qk]
    kv_cache: torch.Tensor,  # [T, D_qk]
    indices: torch.Tensor,  # [B, topk] int32, -1 = padding
    sm_scale: float,
    d_v: int,
    compute_dtype: torch.dtype = torch.float32,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather, masked softmax, weighted sum; returns (out [B, H, d_v], lse [B, H]).

    ``compute_dtype=torch.float32`` (default) is the test reference. Passing the input dtype
    gives the "torch eager" baseline of the benchmark and the engine's ``torch`` backend: the
    matmuls run in that dtype (softmax still in fp32, lse fp32), as an engine without a kernel would.
    ``out`` has q's dtype unless ``out_dtype`` is given (tests take float64, unrounded).
    """
    check_inputs(q, kv_cache, indices, d_v)
    valid = indices >= 0  # [B, topk]
    rows = kv_cache[indices.clamp(min=0).long()].to(compute_dtype)  # [B, topk, D_qk]
    # Softmax in fp32 at least (fp64 when asked: the tests' exact reference).
    soft_dtype = torch.float64 if compute_dtype == torch.float64 else torch.float32
    scores = torch.einsum("bhd,btd->bht", q.to(compute_dtype), rows).to(soft_dtype) * sm_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))  # [B, H, topk]
    lse = torch.logsumexp(scores, dim=-1)  # [B, H]; -inf for all-padding rows
    # exp(score - lse) is NaN where both are -inf (all padding): define those weights as 0.
    lse_safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    probs = torch.exp(scores - lse_safe[..., None])  # [B, H, topk]; 0 at padding
    out = torch.einsum("bht,btd->bhd", probs.to(compute_dtype), rows[..., :d_v])  # [B, H, d_v]
    return out.to(out_dtype or q.dtype), lse
