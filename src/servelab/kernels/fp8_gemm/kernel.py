"""Triton w8a8 block-FP8 GEMM and per-token-group activation quantization.

The GEMM follows the engines' algorithm (SGLang/vLLM `w8a8_block_fp8_matmul`): per K step,
acc += dot(a, b) * a_scale[:, None] * b_scale[None, :], fp32 accumulation, bf16 out. Every
launch parameter comes from a config dict with the engines' keys. M and the scale strides
(ceil(K/128), ceil(N/128)) are not specialized (`do_not_specialize`), so one compiled kernel per
config serves every batch size and every shape whose N and K are multiples of 16: the tuner
compiles each config once for all (shape, M) points.

Beyond the engines' six keys a config may hold SPLIT_K (ours, opt-in; the engines' config
files never carry it). At decode sizes the one-pass grid has too few programs for the SMs
(N = 7168: 56-112 column tiles for 132 SMs, each streaming K = 18432 serially: 44-47% of
4.8 TB/s on the H200, docs/performance.md); SPLIT_K = s gives each tile s programs over
contiguous ranges of K scale groups and reduces their fp32 partials. SPLIT_K = 1 launches the
one-pass kernel, unchanged.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from servelab.kernels.fp8_gemm.formats import CONFIG_KEYS
from servelab.kernels.fp8_gemm.reference import FP8_DTYPE, FP8_MAX, GROUP


@triton.jit
def _tile_of(pid, M, N, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
             GROUP_SIZE_M: tl.constexpr):
    """(pid_m, pid_n) of program `pid` in grouped order: GROUP_SIZE_M row-blocks share each
    column-block while it is in L2."""
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + (pid % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _k_steps(
    a_ptr, b_ptr, as_ptr, bs_ptr, pid_m, pid_n, M, N, K, k_lo, k_hi,
    stride_am, stride_ak, stride_bn, stride_bk, stride_asm, stride_ask, stride_bsn, stride_bsk,
    GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    WHOLE_K: tl.constexpr,
):
    """fp32 [BM, BN] tile of C summed over K steps k_lo <= k < k_hi (each BLOCK_SIZE_K wide);
    WHOLE_K: over all of K (k_lo, k_hi unused), in the one-pass kernel's original instruction
    order (same SASS opcode mix as before the split-K kernel shared this loop)."""
    # Rows/columns past the edge wrap around for loads (always in bounds); stores are masked.
    offs_m = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M        # [BM]
    offs_n = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N        # [BN]
    offs_k = tl.arange(0, BLOCK_SIZE_K)                                     # [BK]
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak   # [BM, BK]
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn   # [BK, BN]
    as_ptrs = as_ptr + offs_m * stride_asm                                  # [BM]
    bs_ptrs = bs_ptr + (offs_n // GROUP_N) * stride_bsn                     # [BN]
    if WHOLE_K:
        k_lo = 0
        k_hi = tl.cdiv(K, BLOCK_SIZE_K)
    else:
        a_ptrs += k_lo * BLOCK_SIZE_K * stride_ak
        b_ptrs += k_lo * BLOCK_SIZE_K * stride_bk

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(k_lo, k_hi):
        k_left = K - k * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        g = (k * BLOCK_SIZE_K) // GROUP_K                                 # this step's scale group
        a_s = tl.load(as_ptrs + g * stride_ask)                              # [BM]
        b_s = tl.load(bs_ptrs + g * stride_bsk)                              # [BN]
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    return acc


@triton.jit
def _round_bf16_in_fp32(x):
    """Round fp32 to the nearest-even bf16 value, kept in fp32. Triton's interpreter truncates
    fp32->bf16; rounding first makes its cast exact, so it matches the GPU's rounding (only
    used when interpreting)."""
    bits = x.to(tl.int32, bitcast=True)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & -0x10000).to(tl.float32, bitcast=True)


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
    pid_m, pid_n = _tile_of(tl.program_id(axis=0), M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)
    acc = _k_steps(a_ptr, b_ptr, as_ptr, bs_ptr, pid_m, pid_n, M, N, K, 0, 0,
                   stride_am, stride_ak, stride_bn, stride_bk,
                   stride_asm, stride_ask, stride_bsn, stride_bsk,
                   GROUP_N, GROUP_K, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, WHOLE_K=True)
    if ROUND_BF16_IN_FP32:
        acc = _round_bf16_in_fp32(acc)
    c = acc.to(c_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


# stride_ws = M*N stays specialized: a multiple of 16 whenever N is, for every M, so the
# partials are stored with vector instructions and one binary still serves every batch size.
@triton.jit(do_not_specialize=["M", "SPLIT_K", "stride_asm", "stride_bsn"])
def _w8a8_block_fp8_matmul_splitk(
    a_ptr, b_ptr, ws_ptr, as_ptr, bs_ptr,           # A [M, K] fp8, B [N, K] fp8
    M, N, K, SPLIT_K,                               # workspace fp32 [SPLIT_K, M, N] or [M, N]
    stride_am, stride_ak, stride_bn, stride_bk,
    stride_asm, stride_ask, stride_bsn, stride_bsk,
    stride_ws, stride_wm,                           # workspace strides (split, row); col = 1
    GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, ATOMIC: tl.constexpr,
):
    """Grid (tiles, SPLIT_K): program (t, s) sums the s-th contiguous range of K steps of tile t
    into fp32. Ranges are whole 128-wide scale groups (BLOCK_SIZE_K divides GROUP_K), split as
    evenly as the group count allows (sizes differ by at most one group). ATOMIC: atomic_add into
    a zeroed [M, N] buffer (summation order unspecified); otherwise a plain store into split s
    of the workspace, reduced in a fixed order by `_splitk_reduce` (deterministic)."""
    pid_m, pid_n = _tile_of(tl.program_id(axis=0), M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)
    pid_k = tl.program_id(axis=1)
    groups = tl.cdiv(K, GROUP_K)
    k_lo = (pid_k * groups // SPLIT_K) * (GROUP_K // BLOCK_SIZE_K)
    k_hi = tl.minimum(((pid_k + 1) * groups // SPLIT_K) * (GROUP_K // BLOCK_SIZE_K),
                      tl.cdiv(K, BLOCK_SIZE_K))          # a partial last group: fewer steps
    acc = _k_steps(a_ptr, b_ptr, as_ptr, bs_ptr, pid_m, pid_n, M, N, K, k_lo, k_hi,
                   stride_am, stride_ak, stride_bn, stride_bk,
                   stride_asm, stride_ask, stride_bsn, stride_bsk,
                   GROUP_N, GROUP_K, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, WHOLE_K=False)
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    w_ptrs = ws_ptr + offs_cm[:, None] * stride_wm + offs_cn[None, :]
    if ATOMIC:
        tl.atomic_add(w_ptrs, acc, mask=mask, sem="relaxed")
    else:
        tl.store(w_ptrs + pid_k * stride_ws, acc, mask=mask)


@triton.jit(do_not_specialize=["M", "SPLIT_K"])
def _splitk_reduce(
    ws_ptr, c_ptr,                                  # workspace fp32 [SPLIT_K, M, N], C [M, N]
    M, N, SPLIT_K, stride_ws, stride_wm, stride_cm, stride_cn,
    BLOCK_N: tl.constexpr, ROUND_BF16_IN_FP32: tl.constexpr,
):
    """Row program_id(0), columns of block program_id(1): C = workspace[0] + workspace[1] + ...
    + workspace[SPLIT_K-1] in fp32, in that order (the same bits every run), cast to C's dtype.
    With SPLIT_K = 1 it is the atomic path's cast."""
    row = tl.program_id(axis=0)
    offs_n = tl.program_id(axis=1) * BLOCK_N + tl.arange(0, BLOCK_N)       # [RN]
    mask = offs_n < N
    w_ptrs = ws_ptr + row * stride_wm + offs_n
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for s in range(0, SPLIT_K):
        acc += tl.load(w_ptrs + s * stride_ws, mask=mask, other=0.0)
    if ROUND_BF16_IN_FP32:
        acc = _round_bf16_in_fp32(acc)
    tl.store(c_ptr + row * stride_cm + offs_n * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask)


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


SPLIT_K_KEY = "SPLIT_K"          # optional launch key beyond the engines' six (default 1)
SPLIT_K_REDUCTIONS = ("workspace", "atomic")
REDUCE_BLOCK_N = 512             # columns per `_splitk_reduce` program: 4 fp32 per thread


def split_k_of(config: Mapping[str, int]) -> int:
    """The config's SPLIT_K (1 when absent), checked: an int >= 1; above 1 only with a
    BLOCK_SIZE_K that divides the 128-wide scale group (each split is whole scale groups)."""
    s = config.get(SPLIT_K_KEY, 1)
    if isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1:
        raise ValueError(f"{SPLIT_K_KEY}={s!r}: must be an int >= 1 (1 = no split)")
    s = int(s)
    if s > 1 and int(config["BLOCK_SIZE_K"]) > GROUP:
        raise ValueError(f"{SPLIT_K_KEY}={s} needs BLOCK_SIZE_K <= {GROUP} (splits are whole "
                         f"{GROUP}-wide scale groups), got BLOCK_SIZE_K={config['BLOCK_SIZE_K']}")
    return s


def check_config(config: Mapping[str, int]) -> None:
    """Raise ValueError naming the missing keys or bad values of a launch config."""
    missing = [key for key in CONFIG_KEYS if key not in config]
    if missing:
        raise ValueError(f"config lacks {missing}; a config has keys {list(CONFIG_KEYS)}")
    for key in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
        v = int(config[key])
        if v < 16 or v & (v - 1):
            raise ValueError(f"{key}={v}: must be a power of two >= 16")
    split_k_of(config)


def w8a8_block_fp8_matmul(
    a_q: torch.Tensor, a_s: torch.Tensor, b_q: torch.Tensor, b_s: torch.Tensor,
    config: Mapping[str, int], out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None, split_k_reduce: str = "workspace",
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """C [M, N] = dequant(a_q, a_s) @ dequant(b_q, b_s).T with the launch parameters of `config`.

    a_q [M, K] fp8, a_s [M, ceil(K/128)] fp32, b_q [N, K] fp8, b_s [ceil(N/128), ceil(K/128)] fp32.
    `config` may hold SPLIT_K = s (not one of the engines' keys; default 1, the engines' kernel):
    s programs per output tile each sum a contiguous range of the K scale groups, and the s fp32
    partials are reduced into C, by `split_k_reduce`: "workspace" (an fp32 [s, M, N] buffer
    summed in a fixed order by a second kernel: deterministic) or "atomic" (fp32 atomic_add
    into a zeroed [M, N] buffer, then a cast: the order of the s additions varies run to run).
    `workspace`: a contiguous fp32 buffer of >= split_k_workspace_numel(...) elements to use
    instead of allocating one per call (e.g. in a CUDA graph); its contents do not matter.
    """
    check_config(config)
    split_k = split_k_of(config)
    if split_k_reduce not in SPLIT_K_REDUCTIONS:
        raise ValueError(f"split_k_reduce={split_k_reduce!r}: use one of {SPLIT_K_REDUCTIONS}")
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
    if split_k > max(1, kg):
        raise ValueError(f"{SPLIT_K_KEY}={split_k} exceeds the {kg} scale groups of K={k} "
                         f"(each split takes whole {GROUP}-wide groups): use at most {kg}")
    if split_k > 1 and split_k * m * n >= 2**31:
        raise ValueError(f"{SPLIT_K_KEY}={split_k} at M={m}, N={n}: the fp32 partials "
                         f"({split_k}*M*N) exceed 32-bit offsets; split-K is for small M")
    if m == 0:
        return out
    if split_k > 1:
        return _launch_split_k(a_q, a_s, b_q, b_s, out, config, split_k, split_k_reduce,
                               workspace)
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


def split_k_workspace_numel(m: int, n: int, split_k: int, reduce: str = "workspace") -> int:
    """fp32 elements of the split-K buffer: s*M*N partials, or M*N for the atomic reduction."""
    return (1 if reduce == "atomic" else split_k) * m * n


def _launch_split_k(a_q: torch.Tensor, a_s: torch.Tensor, b_q: torch.Tensor, b_s: torch.Tensor,
                    out: torch.Tensor, config: Mapping[str, int], split_k: int,
                    reduce: str, workspace: torch.Tensor | None) -> torch.Tensor:
    """The split-K GEMM into an fp32 buffer, then its reduction into `out` (inputs checked)."""
    m, k = a_q.shape
    n = b_q.shape[0]
    atomic = reduce == "atomic"
    rows = 1 if atomic else split_k
    need = split_k_workspace_numel(m, n, split_k, reduce)
    if workspace is None:
        ws = torch.empty((rows, m, n), dtype=torch.float32, device=a_q.device)
    elif (workspace.dtype != torch.float32 or not workspace.is_contiguous()
          or workspace.numel() < need or workspace.device != a_q.device):
        raise ValueError(f"workspace must be contiguous fp32 on {a_q.device} with >= {need} "
                         f"elements ({reduce}, SPLIT_K={split_k}, M={m}, N={n}), got "
                         f"{workspace.dtype} {tuple(workspace.shape)} on {workspace.device}")
    else:
        ws = workspace.view(-1)[:need].view(rows, m, n)
    if atomic:
        ws.zero_()
    bm, bn = int(config["BLOCK_SIZE_M"]), int(config["BLOCK_SIZE_N"])
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), split_k)
    _w8a8_block_fp8_matmul_splitk[grid](
        a_q, b_q, ws, a_s, b_s, m, n, k, split_k,
        a_q.stride(0), a_q.stride(1), b_q.stride(0), b_q.stride(1),
        a_s.stride(0), a_s.stride(1), b_s.stride(0), b_s.stride(1), ws.stride(0), ws.stride(1),
        GROUP_N=GROUP, GROUP_K=GROUP,
        BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=int(config["BLOCK_SIZE_K"]),
        GROUP_SIZE_M=int(config["GROUP_SIZE_M"]), ATOMIC=atomic,
        num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]),
    )
    return splitk_reduce(ws, out)


def splitk_reduce(partials: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [M, N] = partials[0] + partials[1] + ... in fp32, in that order, cast to out's dtype.

    partials: contiguous fp32 [s, M, N], the split-K workspace (s = 1: the atomic path's cast).
    """
    if partials.dtype != torch.float32 or partials.dim() != 3 or not partials.is_contiguous():
        raise ValueError(f"partials must be contiguous fp32 [s, M, N], got {partials.dtype} "
                         f"{tuple(partials.shape)}")
    s, m, n = partials.shape
    if tuple(out.shape) != (m, n):
        raise ValueError(f"out has shape {tuple(out.shape)}, need ({m}, {n})")
    if m * n == 0:
        return out
    _splitk_reduce[(m, triton.cdiv(n, REDUCE_BLOCK_N))](
        partials, out, m, n, s, partials.stride(0), partials.stride(1), out.stride(0),
        out.stride(1), BLOCK_N=REDUCE_BLOCK_N,
        ROUND_BF16_IN_FP32=_interpreting() and out.dtype == torch.bfloat16, num_warps=4,
    )
    return out


def w8a8_block_fp8_linear(x: torch.Tensor, b_q: torch.Tensor, b_s: torch.Tensor,
                          config: Mapping[str, int]) -> torch.Tensor:
    """Quantize activations per token group, then the block GEMM: the engines' linear layer."""
    a_q, a_s = per_token_group_quant(x)
    return w8a8_block_fp8_matmul(a_q, a_s, b_q, b_s, config)
