"""Sparse MLA decode (DeepSeek V3.2 / V4 absorbed attention over top-k selected latent KV rows).

`sparse_mla_decode` runs the fp32 PyTorch reference, the (B, H) Triton fallback ("naive") or
the split-KV kernels ("splitkv", "fp8"). `flops` and `bytes` give the work and the minimum
memory traffic of one call, for roofline percentages.

The split-KV wing, by file: dispatch.py (choose, launch, record what ran) reads
defaults/<gpu>.toml through defaults.py (which kernel runs for which shape and batch, and the
measurement behind each rule); plan.py (the launch plan every launcher reads); geometry.py
(SplitConfig, split count, merge choice); variants.py (the registry of split kernels);
triton_split.py, triton_rp.py, triton_fp8.py (Triton kernels, any GPU); gluon_ws.py,
gluon_fp8.py, gluon_nh.py over gluon_common.py (Hopper); merge.py; fp8.py (the FP8 cache);
lab.py (diagnostics and switches, for benchmarks only).

Triton is imported only when a Triton variant is first called, so the reference and the
counters work without it, and TRITON_INTERPRET=1 set before that first call takes effect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .reference import sparse_mla_decode_reference

if TYPE_CHECKING:
    from .fp8 import Fp8KVCache

VARIANTS = ("reference", "naive", "splitkv", "fp8")


def sparse_mla_decode(
    q: torch.Tensor,  # [B, H, D_qk]
    kv_cache: torch.Tensor | Fp8KVCache,  # [T, D_qk]
    indices: torch.Tensor,  # [B, topk] int32, -1 = padding
    sm_scale: float,
    d_v: int,
    *,
    variant: str = "splitkv",
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attend each request's query heads to its selected KV rows.

    Returns out [B, H, d_v] (q's dtype; the first d_v columns of the rows are the values) and
    lse [B, H] fp32, the natural-log log-sum-exp of ``sm_scale * q . k`` over valid slots.
    Padding slots (-1) are ignored; duplicate indices count once per slot; a request with
    only padding gets out = 0 and lse = -inf. ``num_splits`` (splitkv only) overrides the
    split count chosen from B, H, topk and the SM count. ``variant="fp8"`` takes an
    ``fp8.Fp8KVCache`` as kv_cache (e4m3 + per-tile scales, read by the split kernel).
    The split kernel is the measured default (defaults.py); `dispatch.splitkv_launch` also
    returns the record of what ran.
    ``out``/``lse`` may be preallocated
    (e.g. inside a CUDA graph); indices must lie in [-1, T).
    """
    if variant == "fp8" or not isinstance(kv_cache, torch.Tensor):
        from .fp8 import Fp8KVCache

        if not isinstance(kv_cache, Fp8KVCache):
            raise ValueError("variant 'fp8' needs an Fp8KVCache (fp8.quantize_kv)")
        if variant not in ("fp8", "splitkv", "reference"):
            raise ValueError(f"variant {variant!r} does not read an FP8 cache; use 'fp8'")
        if variant == "reference":
            from .fp8 import dequantize_kv

            kv_cache = dequantize_kv(kv_cache).to(q.dtype)
        else:
            variant = "splitkv"  # the split kernel reads the FP8 layout itself
    if variant == "reference":
        o, lse_ref = sparse_mla_decode_reference(q, kv_cache, indices, sm_scale, d_v)
    elif variant == "naive":
        from .naive import naive_decode

        return naive_decode(q, kv_cache, indices, sm_scale, d_v, out=out, lse=lse)
    elif variant == "splitkv":
        from .dispatch import splitkv_decode

        return splitkv_decode(
            q, kv_cache, indices, sm_scale, d_v, num_splits=num_splits, out=out, lse=lse
        )
    else:
        raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    if out is not None:
        out.copy_(o)
        o = out
    if lse is not None:
        lse.copy_(lse_ref)
        lse_ref = lse
    return o, lse_ref


def flops(batch: int, heads: int, topk: int, d_qk: int, d_v: int) -> int:
    """Matmul FLOPs of one call: per request, head and slot a d_qk dot (scores) and a d_v
    axpy (P V), 2 FLOPs per multiply-add: 2 B H topk (d_qk + d_v). Softmax is not counted
    (O(B H topk), under 0.2% at the real shapes)."""
    return 2 * batch * heads * topk * (d_qk + d_v)


def bytes(  # noqa: A001 - the public name the kernel's roofline code expects
    batch: int,
    heads: int,
    topk: int,
    d_qk: int,
    d_v: int,
    *,
    kv_bytes_per_token: int | None = None,
    elem_bytes: int = 2,
) -> int:
    """Fewest bytes one call must move through device memory: each request's selected KV
    rows once (``kv_bytes_per_token``, default d_qk x elem_bytes; 656/584 for the FP8
    layouts), q read and out written once, lse (fp32) written, indices (int32) read.
    Re-reads of a row by several head blocks or splits are not counted (L2 may absorb them)."""
    per_token = d_qk * elem_bytes if kv_bytes_per_token is None else kv_bytes_per_token
    kv = batch * topk * per_token
    q = batch * heads * d_qk * elem_bytes
    o = batch * heads * d_v * elem_bytes
    lse = batch * heads * 4
    idx = batch * topk * 4
    return kv + q + o + lse + idx


__all__ = ["VARIANTS", "bytes", "flops", "sparse_mla_decode", "sparse_mla_decode_reference"]
