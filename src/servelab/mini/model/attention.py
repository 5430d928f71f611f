"""Sparse absorbed-MLA attention backends, all with the signature of the kernels issue:

    fn(q [N, H, D_qk], kv_cache [T, D_qk], indices [N, K] int32 (-1 = padding), sm_scale, d_v)
        -> (out [N, H, d_v], lse [N, H])

`torch` is our own gather + masked softmax; `naive` and `splitkv` call
`servelab.kernels.sparse_mla.sparse_mla_decode` (Triton, CUDA) with that variant. Every query
token of a forward pass (prefill, decode, verify, MTP) goes through the same function, one row
of `q` per token, so an A/B of backends covers the whole engine.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from servelab.errors import UserError

AttentionFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
BACKENDS = ("torch", "naive", "splitkv")


def torch_sparse_mla(
    q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather the selected latent rows once per token (shared by all heads), masked softmax.

    A row whose indices are all -1 gets out = 0 and lse = -inf (never produced by the engine:
    every query sees at least its own position).
    """
    valid = indices >= 0  # [N, K]
    rows = kv_cache[indices.clamp(min=0).long()]  # [N, K, D_qk]
    scores = torch.bmm(q, rows.transpose(1, 2)).float() * sm_scale  # [N, H, K]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [N, H]
    p = torch.exp(scores - lse[..., None]).nan_to_num_(0.0).to(rows.dtype)  # [N, H, K]
    out = torch.bmm(p, rows[..., :d_v])  # [N, H, d_v]
    return out, lse


def get_backend(name: str, device: str = "cuda") -> AttentionFn:
    """The attention function for `--attention-backend NAME` on `device`."""
    if name == "torch":
        return torch_sparse_mla
    if name not in BACKENDS:
        raise UserError(f"unknown attention backend {name!r}; choose one of {list(BACKENDS)}")
    if not device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
        raise UserError(f"--attention-backend {name} runs Triton kernels: use --device cuda "
                        "(or set TRITON_INTERPRET=1 to run them, slowly, on the CPU)")
    try:
        from servelab.kernels.sparse_mla import sparse_mla_decode
    except ImportError as exc:
        raise UserError(
            f"--attention-backend {name} needs servelab.kernels.sparse_mla.sparse_mla_decode, "
            f"which is not importable here ({exc}); use --attention-backend torch"
        ) from exc

    def kernel_fn(q, kv_cache, indices, sm_scale, d_v):
        return sparse_mla_decode(
            q.contiguous(), kv_cache, indices.to(torch.int32).contiguous(), sm_scale, d_v,
            variant=name,
        )

    return kernel_fn
