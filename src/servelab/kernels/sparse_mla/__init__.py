"""Sparse MLA decode (DeepSeek V3.2 / V4 absorbed attention over top-k selected latent KV rows).

`sparse_mla_decode` runs the fp32 PyTorch reference, the (B, H) Triton fallback ("naive") or
the split-KV kernels ("splitkv", "fp8"). `flops` and `bytes` (counts.py) give the work and the
minimum memory traffic of one call, for roofline percentages.

By folder, top to bottom: dispatch/ (launch.py: choose, launch, record what ran; it reads
defaults/<gpu>.toml through defaults.py: which kernel runs for which shape and batch, and the
measurement behind each rule; variants.py: the registry of split kernels); the kernels,
triton_kernels/ (split, rp, fp8_chunked: any GPU) and gluon_kernels/ (ws, fp8, nh over
common: Hopper); splitkv/ (what every split launcher reads: plan.py the launch plan,
geometry.py SplitConfig, split count and merge choice, merge.py the merge kernel, lab.py
diagnostics and switches for benchmarks only). Beside them: reference.py (fp32 PyTorch),
naive.py (the (B, H) fallback), fp8.py (the FP8 cache), counts.py.

Triton is imported only when a Triton variant is first called, so the reference and the
counters work without it, and TRITON_INTERPRET=1 set before that first call takes effect.
"""

from __future__ import annotations

import torch

from .counts import bytes, flops  # noqa: A004 - the public name roofline code expects
from .fp8 import Fp8KVCache, dequantize_kv
from .reference import sparse_mla_decode_reference

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
    The split kernel is the measured default (dispatch/defaults.py); `dispatch.launch.splitkv_launch` also
    returns the record of what ran.
    ``out``/``lse`` may be preallocated
    (e.g. inside a CUDA graph); indices must lie in [-1, T).
    """
    if variant == "fp8" or not isinstance(kv_cache, torch.Tensor):
        if not isinstance(kv_cache, Fp8KVCache):
            raise ValueError("variant 'fp8' needs an Fp8KVCache (fp8.quantize_kv)")
        if variant not in ("fp8", "splitkv", "reference"):
            raise ValueError(f"variant {variant!r} does not read an FP8 cache; use 'fp8'")
        if variant == "reference":
            kv_cache = dequantize_kv(kv_cache).to(q.dtype)
        else:
            variant = "splitkv"  # the split kernel reads the FP8 layout itself
    if variant == "reference":
        o, lse_ref = sparse_mla_decode_reference(q, kv_cache, indices, sm_scale, d_v)
    elif variant == "naive":
        from .naive import naive_decode

        return naive_decode(q, kv_cache, indices, sm_scale, d_v, out=out, lse=lse)
    elif variant == "splitkv":
        from .dispatch.launch import splitkv_decode

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


__all__ = ["VARIANTS", "bytes", "flops", "sparse_mla_decode", "sparse_mla_decode_reference"]
