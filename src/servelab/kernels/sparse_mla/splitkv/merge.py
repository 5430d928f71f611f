"""Merging split-KV partials: the merge kernel, launched after the split kernel.

Each split s of a (request, head block) leaves a normalised partial O_s [BLOCK_H, d_v] (fp32,
or q's 16-bit dtype with SplitConfig.partial_dtype="input") and lse_s [BLOCK_H]; the merge is
lse = log sum_s exp(lse_s), O = sum_s exp(lse_s - lse) O_s (an empty split has lse_s = -inf
and weighs exp(-inf) = 0; all splits empty -> O = 0, lse = -inf).

Two ways to launch it (``SplitConfig.merge``; the default "auto" picks one by how full the
split grid is, geometry.resolve_merge with the defaults file's `[merge]` rule):

- ``"kernel"``: `_sparse_mla_merge_kernel`, a second launch with grid (B, H, column slices).
- ``"pdl"``: the same kernel launched with programmatic dependent launch (Hopper): it is
  scheduled while the split kernel runs and waits in ``griddepcontrol.wait`` for its results,
  hiding the launch latency of the second kernel (the Triton split kernels trigger it).

(A merge fused into the split kernel's last program lost everywhere it was timed and was
removed; docs/notes/sparse-mla.md has the numbers.)
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

try:  # programmatic dependent launch (Triton >= 3.4 on Hopper)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: "pdl" is then not offered
    gdc_wait = gdc_launch_dependents = None

def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch needs a compiled launch (not the interpreter), Hopper or
    newer (griddepcontrol is sm_90+) and a Triton that exposes it."""
    if device.type != "cuda" or gdc_wait is None:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


@triton.jit
def _sparse_mla_merge_kernel(
    po_ptr,  # [B, S, H, d_v] fp32 or 16-bit, each split normalised
    plse_ptr,  # [B, S, H] fp32
    out_ptr,  # [B, H, d_v]
    lse_ptr,  # [B, H] fp32
    num_splits,
    stride_pob,
    stride_pos,
    stride_poh,
    stride_plb,
    stride_pls,
    stride_ob,
    stride_oh,
    stride_lb,
    D_V: tl.constexpr,
    BLOCK_DVC: tl.constexpr,  # d_v columns per program (grid axis 2)
    BLOCK_S: tl.constexpr,
    S_CHUNK: tl.constexpr,  # splits per unrolled step (divides BLOCK_S)
    PDL: tl.constexpr,  # launched as a programmatic dependent of the split kernel
    trace_ptr=None,  # [programs, 4] int64 when TRACE: SM id, entry, after the wait, end (ns)
    TRACE: tl.constexpr = False,
):
    # One shot, no dependent loop over splits: all S partials of a column slice are loaded
    # together (unrolled chunks, independent loads), so the merge costs one L2 round trip
    # instead of S dependent ones (a split loop made the
    # merge the largest part of a B=1 call on the H200).
    if TRACE:
        t_entry = _globaltimer()
    if PDL:
        gdc_wait()  # the split kernel's partials are complete and visible after this
    if TRACE:
        t_wait = _globaltimer()
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < num_splits
    lse_s = tl.load(
        plse_ptr + b * stride_plb + offs_s * stride_pls + h, mask=mask_s, other=-float("inf")
    )  # [BLOCK_S]
    m = tl.max(lse_s, axis=0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    total = tl.sum(tl.exp(lse_s - m_safe), axis=0)
    denom = tl.where(total > 0.0, total, 1.0)
    offs_d = tl.program_id(2) * BLOCK_DVC + tl.arange(0, BLOCK_DVC)
    mask_d = offs_d < D_V
    # The partials in chunks of S_CHUNK splits, unrolled (all loads independent): with the
    # warps along the columns (launch_merge's num_warps) each thread sums its columns' splits
    # in registers, and a chunk bounds the registers that takes.
    acc = tl.zeros([BLOCK_DVC], dtype=tl.float32)
    for c in tl.static_range(0, BLOCK_S, S_CHUNK):
        offs_c = c + tl.arange(0, S_CHUNK)
        mask_c = offs_c < num_splits
        lse_c = tl.load(plse_ptr + b * stride_plb + offs_c * stride_pls + h, mask=mask_c,
                        other=-float("inf"))  # fmt: skip
        w_c = tl.exp(lse_c - m_safe) / denom  # [S_CHUNK], 0 for empty splits
        o_c = tl.load(
            po_ptr + b * stride_pob + offs_c[:, None] * stride_pos + h * stride_poh
            + offs_d[None, :],
            mask=mask_c[:, None] & mask_d[None, :],
            other=0.0,
        )  # [S_CHUNK, BLOCK_DVC]
        acc += tl.sum(w_c[:, None] * o_c.to(tl.float32), axis=0)
    tl.store(
        out_ptr + b * stride_ob + h * stride_oh + offs_d,
        acc.to(out_ptr.dtype.element_ty),
        mask=mask_d,
    )
    if tl.program_id(2) == 0:
        # log(0) = -inf for all-padding rows, which is the defined lse there.
        tl.store(lse_ptr + b * stride_lb + h, m_safe + tl.log(total))
    if TRACE:
        pid = (b * tl.num_programs(1) + h) * tl.num_programs(2) + tl.program_id(2)
        row = trace_ptr + pid * 4
        tl.store(row, _smid().to(tl.int64))
        tl.store(row + 1, t_entry)
        tl.store(row + 2, t_wait)
        tl.store(row + 3, _globaltimer())


@triton.jit
def _globaltimer():
    """The GPU's global nanosecond timer (the same clock on every SM)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)  # fmt: skip


@triton.jit
def _smid():
    """The SM this program runs on."""
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                     is_pure=False, pack=1)  # fmt: skip


# Most partial elements one merge program loads ([BLOCK_S, BLOCK_DVC]). At 16K (not 8K) a
# 32-split merge of d_v = 512 is one [32, 512] tile per head: with 4 warps Triton lays the
# warps along the columns, so each thread sums all splits of its 4 columns in registers
# (128 registers, no shared memory), where a [32, 256] tile reduced across warps through
# shared memory. H200, 2026-11-30 (probes merge-trace, docs/notes/sparse-mla.md, eighth follow-up): V4-Flash B = 1
# 8.09 -> 7.55 us, H32 7.41 -> 6.90, V4-Pro 11.75 -> 11.29, V3.2 14.73 -> 13.63; the merge's
# programs ran 1.5 us instead of 2.3. Tiles of <= 16 splits are [S, 512] either way.
MERGE_TILE_ELEMS = 16384


def merge_grid(partials_shape: tuple[int, ...], block_dvc: int | None = None,
               tile_elems: int = MERGE_TILE_ELEMS):  # fmt: skip
    """(grid, BLOCK_S, BLOCK_DVC) of the merge kernel for partials [B, S, H, d_v]."""
    b, num_splits, h, d_v = partials_shape
    block_s = max(triton.next_power_of_2(num_splits), 2)
    if block_dvc is None:
        block_dvc = min(max(triton.next_power_of_2(d_v), 16), max(tile_elems // block_s, 16))
    return (b, h, triton.cdiv(d_v, block_dvc)), block_s, block_dvc


# Warps and split chunks of the merge kernel: 4 warps and all splits at once, or
# ("column warps") as many warps as there are 16-byte vectors across the program's columns /
# 32 lanes (at most 4), so that Triton lays the warps along the columns and each thread sums
# its columns' splits in registers, in unrolled chunks of at most 128 values per thread.
# The default: column warps for 16-bit partials where that gives >= 2 warps (>= 512
# columns). H200, 2026-11-30 (probes merge-trace, docs/notes/sparse-mla.md, eighth follow-up): with 16-bit partials
# 4 warps put 8-value vectors across [2, 2] warps and reduced through shared memory, and the
# merge's programs ran 3.3-9.6 us against 1.0-1.6 us with column warps (V4-Flash B = 64
# 49.2 -> 31.4 us a call, B = 16 23.8 -> 19.2); one-warp programs (128 columns, the H16
# slice's 128 splits at B = 1) piled up to 8 on an SM and took 14.6 us a call. With fp32
# partials the layouts are the same wherever d_v fits one program, and elsewhere column
# warps were slower (the H16 slice at B = 1: 7.8 -> 8.8 us).


def merge_warps_and_chunk(block_s: int, block_dvc: int, elem_size: int,
                          column_warps: bool) -> tuple[int, int]:  # fmt: skip
    """(num_warps, S_CHUNK) of a merge program over [BLOCK_S, BLOCK_DVC] partials."""
    if not column_warps:
        return 4, block_s
    vec = 16 // elem_size  # values per 16-byte load
    return max(1, min(4, block_dvc // (32 * vec))), min(block_s, max(128 // vec, 1))


def launch_merge(
    partials: tuple[torch.Tensor, torch.Tensor],  # ([B, S, H, d_v] fp32/16-bit, [B, S, H] fp32)
    out: torch.Tensor,  # [B, H, d_v]
    lse: torch.Tensor,  # [B, H] fp32
    pdl: bool,
    *,
    num_warps: int | None = None,
    block_dvc: int | None = None,
    tile_elems: int = MERGE_TILE_ELEMS,
    s_chunk: int | None = None,
    column_warps: bool | None = None,
    trace: torch.Tensor | None = None,
):
    """Launch the merge kernel over `partials` into out/lse; returns the compiled kernel.

    These override the default geometry (diagnostics and probes):
    - num_warps: warps per program (a power of two, 1-32);
    - block_dvc: d_v columns per program (a power of two >= 16);
    - tile_elems: the default block_dvc's cap, BLOCK_S x BLOCK_DVC elements (a power of two);
    - s_chunk: splits per unrolled step (a power of two; more than BLOCK_S means one step);
    - column_warps: see merge_warps_and_chunk (None: for 16-bit partials over >= 512 columns).
    trace, an int64 tensor with 4 entries per program (merge_grid), receives each program's
    SM id and globaltimer stamps at entry, after the PDL wait and at the end; row
    (b * H + h) * slices + slice, which is not the order the hardware launches them in
    (a lab diagnostic: benchmarks/bench_sparse_mla_probes.py merge-trace)."""
    po, plse = partials
    b, num_splits, h, d_v = po.shape
    for name, v, lo, hi in (("num_warps", num_warps, 1, 32), ("block_dvc", block_dvc, 16, None),
                            ("tile_elems", tile_elems, 16, None), ("s_chunk", s_chunk, 1, None)):  # fmt: skip
        if v is not None and (v < lo or (hi is not None and v > hi) or v & (v - 1)):
            raise ValueError(f"{name} must be a power of two in [{lo}, {hi or 'inf'}], got {v}")
    grid, block_s, block_dvc = merge_grid(tuple(po.shape), block_dvc, tile_elems)
    if trace is not None and (trace.dtype != torch.int64 or trace.numel() < 4 * math.prod(grid)):
        raise ValueError(f"trace must be int64 with >= {4 * math.prod(grid)} entries")
    if column_warps is None:
        column_warps = po.element_size() == 2 and block_dvc >= 512
    warps, chunk = merge_warps_and_chunk(block_s, block_dvc, po.element_size(), column_warps)
    num_warps = num_warps or warps
    s_chunk = min(s_chunk or chunk, block_s)  # one chunk when asked for more than BLOCK_S
    extra = {"launch_pdl": True} if pdl else {}
    if trace is not None:
        extra.update(trace_ptr=trace, TRACE=True)
    return _sparse_mla_merge_kernel[grid](
        po, plse, out, lse,
        num_splits,
        po.stride(0), po.stride(1), po.stride(2),
        plse.stride(0), plse.stride(1),
        out.stride(0), out.stride(1), lse.stride(0),
        D_V=d_v,
        BLOCK_DVC=block_dvc,
        BLOCK_S=block_s,
        S_CHUNK=s_chunk,
        PDL=pdl,
        num_warps=num_warps,
        **extra,
    )  # fmt: skip
