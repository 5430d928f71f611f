"""Triton w8a8 block-FP8 GEMM and per-token-group activation quantization.

The GEMM follows the engines' algorithm (SGLang/vLLM `w8a8_block_fp8_matmul`): per K step,
acc += dot(a, b) * a_scale[:, None] * b_scale[None, :], fp32 accumulation, bf16 out. Every
launch parameter comes from a config dict with the engines' keys. M and the scale strides
(ceil(K/128), ceil(N/128)) are not specialized (`do_not_specialize`), so one compiled kernel per
config serves every batch size and every shape whose N and K are multiples of 16: the tuner
compiles each config once for all (shape, M) points.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from servelab.kernels.fp8_gemm.reference import FP8_DTYPE, FP8_MAX, GROUP
from servelab.tune.formats import CONFIG_KEYS


@triton.jit(do_not_specialize=["M", "stride_asm", "stride_bsn"])
def _w8a8_block_fp8_matmul(
    a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr,            # A [M, K] fp8, B [N, K] fp8, C [M, N]
    M, N, K,                                        # As [M, Kg] fp32, Bs [Ng, Kg] fp32
    stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
    stride_asm, stride_ask, stride_bsn, stride_bsk,
    GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, ROUND_BF16_IN_FP32: tl.constexpr = False,
):
    # Grouped ordering: GROUP_SIZE_M row-blocks share each column-block while it is in L2.
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + (pid % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # Rows/columns past the edge wrap around for loads (always in bounds); stores are masked.
    offs_m = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M        # [BM]
    offs_n = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N        # [BN]
    offs_k = tl.arange(0, BLOCK_SIZE_K)                                     # [BK]
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak   # [BM, BK]
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn   # [BK, BN]
    as_ptrs = as_ptr + offs_m * stride_asm                                  # [BM]
    bs_ptrs = bs_ptr + (offs_n // GROUP_N) * stride_bsn                     # [BN]

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k_left = K - k * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        g = (k * BLOCK_SIZE_K) // GROUP_K                                    # scale group of this step
        a_s = tl.load(as_ptrs + g * stride_ask)                              # [BM]
        b_s = tl.load(bs_ptrs + g * stride_bsk)                              # [BN]
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    if ROUND_BF16_IN_FP32:
        # Triton's interpreter truncates fp32->bf16; round to nearest even here so its cast is
        # exact and the interpreter matches the GPU's rounding (only set when interpreting).
        bits = acc.to(tl.int32, bitcast=True)
        acc = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -0x10000).to(tl.float32, bitcast=True)
    c = acc.to(c_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


@triton.jit
def _per_token_group_quant(
    x_ptr, q_ptr, s_ptr,                 # x [M, K], q [M, K] fp8, s [M, Kg] fp32
    K, stride_xm, stride_qm, stride_sm,
    eps, fp8_min, fp8_max,
    GROUP_SIZE: tl.constexpr, BLOCK: tl.constexpr, ROUND_IN_FP32: tl.constexpr,
):
    row = tl.program_id(0)
    grp = tl.program_id(1)
    cols = grp * GROUP_SIZE + tl.arange(0, BLOCK)                           # [BLOCK]
    mask = (tl.arange(0, BLOCK) < GROUP_SIZE) & (cols < K)
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.maximum(tl.max(tl.abs(x), axis=0), eps) / fp8_max
    q = tl.clamp(x / s, fp8_min, fp8_max)
    if ROUND_IN_FP32:
        # Triton's interpreter (3.5-3.9) rounds fp32->fp8 without carrying into the exponent
        # (124.3 -> 64.0). Round to e4m3 in fp32 first, so its cast is exact: round-to-nearest-even
        # on the 3 kept mantissa bits for normals, to multiples of 2^-9 below 2^-6 (subnormals).
        bits = q.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
        q_norm = bits.to(tl.float32, bitcast=True)
        q_sub = ((q * 512.0 + 12582912.0) - 12582912.0) / 512.0
        q = tl.where(tl.abs(q) < 0.015625, q_sub, q_norm)
    tl.store(q_ptr + row * stride_qm + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * stride_sm + grp, s)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def per_token_group_quant(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize activations x [M, K] (fp16/bf16/fp32) to fp8 per token per `group` columns.

    Returns (q [M, K] float8_e4m3fn, s [M, ceil(K/group)] fp32), as `reference.quantize_per_token_group`.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    x = x.contiguous()
    m, k = x.shape
    kg = triton.cdiv(k, group)
    q = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    s = torch.empty((m, kg), dtype=torch.float32, device=x.device)
    if m == 0:
        return q, s
    _per_token_group_quant[(m, kg)](
        x, q, s, k, x.stride(0), q.stride(0), s.stride(0), 1e-10, -FP8_MAX, FP8_MAX,
        GROUP_SIZE=group, BLOCK=triton.next_power_of_2(group), ROUND_IN_FP32=_interpreting(),
    )
    return q, s


def check_config(config: Mapping[str, int]) -> None:
    """Raise ValueError naming the missing keys or bad values of a launch config."""
    missing = [key for key in CONFIG_KEYS if key not in config]
    if missing:
        raise ValueError(f"config lacks {missing}; a config has keys {list(CONFIG_KEYS)}")
    for key in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
        v = int(config[key])
        if v < 16 or v & (v - 1):
            raise ValueError(f"{key}={v}: must be a power of two >= 16")


def w8a8_block_fp8_matmul(
    a_q: torch.Tensor, a_s: torch.Tensor, b_q: torch.Tensor, b_s: torch.Tensor,
    config: Mapping[str, int], out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """C [M, N] = dequant(a_q, a_s) @ dequant(b_q, b_s).T with the launch parameters of `config`.

    a_q [M, K] fp8, a_s [M, ceil(K/128)] fp32, b_q [N, K] fp8, b_s [ceil(N/128), ceil(K/128)] fp32.
    """
    check_config(config)
    if a_q.dim() != 2 or b_q.dim() != 2 or a_q.shape[1] != b_q.shape[1]:
        raise ValueError(f"shapes A {tuple(a_q.shape)} and B {tuple(b_q.shape)}: need [M, K] and [N, K]")
    m, k = a_q.shape
    n = b_q.shape[0]
    kg, ng = triton.cdiv(k, GROUP), triton.cdiv(n, GROUP)
    if tuple(a_s.shape) != (m, kg) or tuple(b_s.shape) != (ng, kg):
        raise ValueError(f"scales A {tuple(a_s.shape)} B {tuple(b_s.shape)}: need ({m}, {kg}) and ({ng}, {kg})")
    if a_q.dtype != FP8_DTYPE or b_q.dtype != FP8_DTYPE:
        raise ValueError(f"A and B must be {FP8_DTYPE}, got {a_q.dtype} and {b_q.dtype}")
    if a_q.stride(1) != 1 or b_q.stride(1) != 1:
        raise ValueError("A and B must be contiguous along K")
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=a_q.device)
    elif tuple(out.shape) != (m, n):
        raise ValueError(f"out has shape {tuple(out.shape)}, need ({m}, {n})")
    if m == 0:
        return out
    bm, bn = int(config["BLOCK_SIZE_M"]), int(config["BLOCK_SIZE_N"])
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _w8a8_block_fp8_matmul[grid](
        a_q, b_q, out, a_s, b_s, m, n, k,
        a_q.stride(0), a_q.stride(1), b_q.stride(0), b_q.stride(1), out.stride(0), out.stride(1),
        a_s.stride(0), a_s.stride(1), b_s.stride(0), b_s.stride(1),
        GROUP_N=GROUP, GROUP_K=GROUP,
        BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=int(config["BLOCK_SIZE_K"]),
        GROUP_SIZE_M=int(config["GROUP_SIZE_M"]),
        ROUND_BF16_IN_FP32=_interpreting() and out.dtype == torch.bfloat16,
        num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]),
    )
    return out


def w8a8_block_fp8_linear(x: torch.Tensor, b_q: torch.Tensor, b_s: torch.Tensor,
                          config: Mapping[str, int]) -> torch.Tensor:
    """Quantize activations per token group, then the block GEMM: the engines' linear layer."""
    a_q, a_s = per_token_group_quant(x)
    return w8a8_block_fp8_matmul(a_q, a_s, b_q, b_s, config)
