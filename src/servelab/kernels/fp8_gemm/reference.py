"""Plain PyTorch reference for w8a8 block-FP8 GEMM, its quantizers, and its cost model.

Layout (as SGLang/vLLM): activations A [M, K] quantized per token per 128-column group
(scales [M, ceil(K/128)]); weights B [N, K] quantized per 128x128 block (scales
[ceil(N/128), ceil(K/128)]); C = dequant(A) @ dequant(B).T, fp32 accumulation, bf16 out.
"""

from __future__ import annotations

import math

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0          # torch.finfo(torch.float8_e4m3fn).max
GROUP = 128              # quantization group along K (activations) and block edge (weights)
EPS = 1e-10              # floor on a group's absmax so an all-zero group gets a finite scale


def quantize_per_token_group(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x [M, K] to fp8 per token per `group` columns; returns (q [M, K], s [M, ceil(K/g)] fp32).

    The last group may be partial (K not a multiple of `group`); its absmax covers only its columns.
    """
    m, k = x.shape
    ng = math.ceil(k / group)
    xf = torch.nn.functional.pad(x.float(), (0, ng * group - k))          # [M, ng*g]
    xg = xf.view(m, ng, group)
    s = xg.abs().amax(dim=-1).clamp(min=EPS) / FP8_MAX                  # [M, ng]
    q = (xg / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(m, ng * group)[:, :k].contiguous(), s


def quantize_weight_per_block(w: torch.Tensor, block: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize w [N, K] to fp8 per `block` x `block` tile; returns (q [N, K], s [ceil(N/b), ceil(K/b)])."""
    n, k = w.shape
    nb, kb = math.ceil(n / block), math.ceil(k / block)
    wf = torch.nn.functional.pad(w.float(), (0, kb * block - k, 0, nb * block - n))
    wt = wf.view(nb, block, kb, block)
    s = wt.abs().amax(dim=(1, 3)).clamp(min=EPS) / FP8_MAX              # [nb, kb]
    q = (wt / s[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(nb * block, kb * block)[:n, :k].contiguous(), s


def dequantize_a(q: torch.Tensor, s: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """fp64 values of per-token-group quantized activations [M, K]."""
    return q.double() * s.double().repeat_interleave(group, dim=1)[:, : q.shape[1]]


def dequantize_b(q: torch.Tensor, s: torch.Tensor, block: int = GROUP) -> torch.Tensor:
    """fp64 values of per-block quantized weights [N, K]."""
    full = s.double().repeat_interleave(block, dim=0).repeat_interleave(block, dim=1)
    return q.double() * full[: q.shape[0], : q.shape[1]]


def w8a8_block_matmul(a_q: torch.Tensor, a_s: torch.Tensor, b_q: torch.Tensor,
                      b_s: torch.Tensor) -> torch.Tensor:
    """Exact (fp64) C [M, N] = dequant(A) @ dequant(B).T, before any rounding to the output dtype."""
    return dequantize_a(a_q, a_s) @ dequantize_b(b_q, b_s).T


def abs_matmul(a_q: torch.Tensor, a_s: torch.Tensor, b_q: torch.Tensor,
               b_s: torch.Tensor) -> torch.Tensor:
    """sum_k |a_mk b_nk| (fp64): the scale of the rounding errors a summation order can make."""
    return dequantize_a(a_q, a_s).abs() @ dequantize_b(b_q, b_s).abs().T


def flops(m: int, n: int, k: int) -> int:
    """Floating-point operations of one GEMM: a multiply and an add per (m, n, k)."""
    return 2 * m * n * k


def bytes_moved(m: int, n: int, k: int, group: int = GROUP, out_bytes: int = 2) -> int:
    """Fewest bytes one GEMM moves through device memory: fp8 A and B, fp32 scales, bf16 C,
    each read or written once."""
    kg = math.ceil(k / group)
    return m * k + n * k + 4 * m * kg + 4 * math.ceil(n / group) * kg + out_bytes * m * n


def weight_bytes(n: int, k: int, group: int = GROUP) -> int:
    """Bytes of the fp8 weight and its block scales: the floor of a decode-sized (small M) GEMM."""
    return n * k + 4 * math.ceil(n / group) * math.ceil(k / group)


bytes = bytes_moved  # noqa: A001  the name the kernel convention uses (flops()/bytes())
