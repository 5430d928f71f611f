"""Split-KV sparse MLA decode, warp-specialised (Gluon, Hopper only; 16-bit KV).

A one-partition Gluon kernel (the first one, since removed: it was never a default) ran one
tile at a time through all 8 warps: gather, score dot, softmax (row max and sum crossing the
two warpgroups through shared memory), P's layout change, P V, with CTA barriers between the
steps, so the tensor cores idle during the softmax and the gathers; its loop without gathers
took ~88% of the full time (docs/notes/sparse-mla.md, fourth follow-up). Here three partitions of 4 warps each run their own loop, handing tiles over by mbarriers:

- **loader** (worker): gathers tile j's rows by cp.async into K buffer j % NK (after the
  consumers have released it), then signals ``k_ready``;
- **scorer** (default partition): S = q K^T over the whole 64-token tile (one warpgroup, no
  cross-warpgroup reductions), the online softmax, P to shared memory for the other half,
  then P V for the first half of d_v (P from registers); releases the K buffer;
- **second half** (worker): P V for the second half of d_v, P from shared memory, rescaled by
  the scorer's per-row factor; releases P and the K buffer.

So the second half's P V of tile j runs while the scorer's score dot of tile j + 1 does, and
the gathers run beside both. Same grid, partials and merge as the other split kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton

from ..splitkv.lab import GLUON_DROP
from . import common as gluon_common
from .common import AVAILABLE
from .ws_trace import TRACE_COLS, TRACE_LAYOUT, TRACE_TILES  # noqa: F401

if TYPE_CHECKING:
    from ..splitkv.lab import Lab
    from ..splitkv.plan import LaunchPlan

if AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
    )

    from .common import (
        _cta_barrier,
        _load_q,
        _program_ids,
        _split_tiles,
    )
    from .ws_partitions import _loader, _scorer, _second_half
    from .ws_trace import (
        T_COLS,
        T_ENTRY,
        T_SM,
        _stamp,
    )

    @gluon.jit
    def _sparse_mla_split_gluon_ws_kernel(
        q_ptr,  # [B, H, D_qk]
        kv_ptr,  # [T, D_qk]
        idx_ptr,  # [B, topk] int32
        o_ptr,  # final [B, H, d_v] or partial [B, S, H, d_v]
        lse_ptr,  # final [B, H] or partial [B, S, H] fp32
        H,
        topk,
        tiles_per_split,
        stride_qb8,  # q's and KV's strides / 8 (16-byte units, for cp.async)
        stride_qh8,
        stride_kvt8,
        stride_ib,
        stride_ob,
        stride_os,
        stride_oh,
        stride_lb,
        stride_ls,
        scale_log2,
        D_V: gl.constexpr,
        D_TAIL: gl.constexpr,  # score-only columns after d_v (V3.2: 64), 0 if none
        BLOCK_H: gl.constexpr,  # 64: one wgmma M
        BLOCK_N: gl.constexpr,
        BLOCK_T: gl.constexpr,  # D_TAIL padded to a power of two >= 16
        NK: gl.constexpr,  # K buffers
        DROP: gl.constexpr,  # diagnostics (wrong results): 1 no gathers, 2 no dots
        SECOND_REGS: gl.constexpr,  # registers per thread of the two workers
        LOADER_REGS: gl.constexpr,
        num_warps: gl.constexpr,  # 4: the scorer; the workers bring 4 each
        STAGED: gl.constexpr,  # O stored through a free K buffer (where one holds it)
        Q_LATE: gl.constexpr,  # q's copies issued once the first tile's indices are in
        HB_FAST: gl.constexpr,  # grid (head blocks, B, splits) (gluon_common.grid_order)
        trace_ptr=None,  # [programs, TRACE_COLS] int64 when TRACE (TRACE_LAYOUT)
        TRACE: gl.constexpr = False,
    ):
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
        sh_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], dtype)
        sh_q: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_V], dtype)
        sh_p: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], dtype)
        sh_kt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_T], dtype)
        flat1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])

        b, hb, n_hb = _program_ids(HB_FAST)
        sp = gl.program_id(2)
        t_start, n_local, n_lim = _split_tiles(topk, tiles_per_split, BLOCK_N)
        p_start = t_start * BLOCK_N  # the split's first token
        # Staged for 16-bit O only (the output at one split, 16-bit partials): fp32 partials
        # store whole 32-byte sectors from the accumulator's layout, and staging them was
        # slower at B = 16-64 (H200, ninth follow-up).
        STAGE: gl.constexpr = STAGED and o_ptr.dtype.element_ty.primitive_bitwidth == 16 and (
            BLOCK_N * D_V >= BLOCK_H * (D_V // 2))
        tr = lse_ptr  # (unused without TRACE: the partitions take a pointer either way)
        if TRACE:
            tr = trace_ptr + ((b * n_hb + hb) * gl.num_programs(2) + sp) * T_COLS
            gl.store(tr + T_SM, gl.inline_asm_elementwise(
                "mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1
            ).to(gl.int64))  # fmt: skip
            _stamp(tr, T_ENTRY, TRACE)

        # q, issued by the scorer's warps before the partitions start; the scorer waits for it
        # just before its first score dot, so q's load overlaps the loader's first gathers
        # (H200, 2026-11-30, two interleaved timings: 1-2% faster at V4-Flash B = 32-128, up
        # to 4% at H32, within the spread of repeated timings; docs/notes/sparse-mla.md, seventh
        # follow-up).
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, D_V], sh_q)
        if not Q_LATE:
            _load_q(q_smem, q_ptr + b * (stride_qb8 * 8), hb, H, stride_qh8, D_V, BLOCK_H, ld)
            cp.commit_group()
        kbuf = gl.allocate_shared_memory(dtype, [NK, BLOCK_N, D_V], sh_kv)
        ktail = gl.allocate_shared_memory(dtype, [NK if D_TAIL > 0 else 1, BLOCK_N, BLOCK_T],
                                          sh_kt)  # fmt: skip
        s_p = gl.allocate_shared_memory(dtype, [BLOCK_H, BLOCK_N], sh_p)
        idx_ring = gl.allocate_shared_memory(gl.int32, [NK, BLOCK_N], flat1)
        s_alpha = gl.allocate_shared_memory(gl.float32, [BLOCK_H], flat1)
        l_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], flat1)
        k_ready = gl.allocate_shared_memory(gl.int64, [NK, 1], mbarrier.MBarrierLayout())
        k_free = gl.allocate_shared_memory(gl.int64, [NK, 1], mbarrier.MBarrierLayout())
        p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        idx_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(idx_bar, count=1)  # the loader, once its first indices are in
        for i in gl.static_range(NK):
            mbarrier.init(k_ready.index(i), count=1)  # the loader
            mbarrier.init(k_free.index(i), count=2)  # the scorer and the second half
        mbarrier.init(p_ready, count=1)
        mbarrier.init(p_free, count=1)
        mbarrier.init(done, count=1)
        fence_async_shared()  # the barriers' initialisation, before any partition uses them
        _cta_barrier()

        gl.warp_specialize([
            (_scorer, (q_smem, kbuf, ktail, idx_ring, s_p, s_alpha, l_smem, k_ready, k_free,
                       p_ready, p_free, done, idx_bar, q_ptr, stride_qb8, stride_qh8, o_ptr, lse_ptr, b,
                       hb, sp, H, p_start, n_local, n_lim, stride_ob, stride_os, stride_oh,
                       stride_lb, stride_ls, scale_log2, D_V, D_TAIL, BLOCK_T, BLOCK_H, BLOCK_N,
                       NK, DROP, tr, TRACE, STAGE, Q_LATE)),
            (_second_half, (kbuf, s_p, s_alpha, l_smem, k_free, p_ready, p_free, done, o_ptr, b,
                            hb, sp, H, n_local, stride_ob, stride_os, stride_oh, D_V, BLOCK_H,
                            NK, DROP, tr, TRACE, STAGE)),
            (_loader, (kbuf, ktail, idx_ring, k_ready, k_free, idx_bar, kv_ptr, idx_ptr + b * stride_ib,
                       p_start, n_local, n_lim, stride_kvt8, D_V, D_TAIL,
                       BLOCK_T, BLOCK_N, NK, DROP, tr, TRACE)),
        ], [4, 4], [SECOND_REGS, LOADER_REGS])  # fmt: skip


DROPS = ("", "gather", "dots")  # the lab diagnostics this kernel implements


def consts(plan: LaunchPlan, lab: Lab) -> dict:
    """The kernel's compile-time arguments for a launch (its compile cache key). Registers
    per thread (setmaxnreg; 512 per lane across the three 4-warp partitions): the second
    half holds a 64 x 256 fp32 accumulator (128) plus addresses -> 168; the loader only
    addresses and masks -> 88; the scorer gets the rest, 256 - 8 = 248 (ptxas: no spills at
    V3.2's and V4's shapes, Triton 3.6). The switches (lab.Lab; shipped on):
    STAGED, 16-bit O stored through a K buffer freed by the end of the loop (ninth
    follow-up: V4-Flash B = 16 17.13 -> 13.35 us); Q_LATE, q's copies issued once the loader
    has its first tile's indices, so the index load does not queue behind q's 64 KB; HB_FAST,
    the grid (head blocks, B, splits) where the programs outnumber the SMs (tenth follow-up:
    V3.2 B = 128 189-192 -> 163-171 us; gluon_common.grid_order)."""
    d_tail = plan.p.d_tail
    cfg = plan.cfg
    return dict(D_V=plan.p.d_v, D_TAIL=d_tail, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
                BLOCK_T=max(triton.next_power_of_2(max(d_tail, 1)), 16), NK=cfg.num_stages,
                DROP=GLUON_DROP.get(lab.drop, 0), SECOND_REGS=168, LOADER_REGS=88,
                STAGED=lab.staged_stores, Q_LATE=lab.q_after_indices,
                HB_FAST=lab.heads_first, num_warps=4)  # fmt: skip


def smem_bytes(kc: dict) -> int:
    """Shared memory the kernel asks for (q, K buffers and tails, P, the buffers' indices)
    plus 10 KB for the barriers, the per-row factors and layout-conversion scratch (Triton
    3.6 and 3.9 asked 8-9 KB more than the buffers at V3.2's shape)."""
    bn, nk = kc["BLOCK_N"], kc["NK"]
    tail = nk * bn * kc["BLOCK_T"] if kc["D_TAIL"] > 0 else 0
    return (2 * (kc["BLOCK_H"] * kc["D_V"] + nk * bn * kc["D_V"] + tail + kc["BLOCK_H"] * bn)
            + 4 * nk * bn + 10 * 1024)  # fmt: skip


def serves(plan: LaunchPlan, lab: Lab) -> bool:
    """Whether this kernel can run the launch: a 16-bit cache; 64-head tiles of 16-64 tokens
    and >= 2 K buffers; d_v a power of two in 128..512 (each half one wgmma N >= 64, a whole
    128-byte swizzle atom); 16-byte rows for cp.async; then gluon_common.usable (Hopper,
    shared memory, no earlier compile failure)."""
    p, cfg = plan.p, plan.cfg
    if p.fp8 or lab.drop not in DROPS:
        return False
    if not (cfg.block_h == 64 and 16 <= cfg.block_n <= 64 and cfg.num_stages >= 2
            and 128 <= p.d_v <= 512 and p.d_v & (p.d_v - 1) == 0 and p.d_tail % 8 == 0
            and p.kv.element_size() == 2 and p.q.element_size() == 2):  # fmt: skip
        return False
    if not gluon_common.rows_aligned((p.q.stride(0), 8), (p.q.stride(1), 8), (p.kv.stride(0), 8),
                                     tensors=(p.q, p.kv)):  # fmt: skip
        return False
    kc = consts(plan, lab)
    return gluon_common.usable(plan, kc, smem_bytes(kc))


def launch(plan: LaunchPlan, lab: Lab):
    """Launch the kernel; the compiled kernel; raises gluon_common.CompileFailed (after a one-time
    warning) if it does not compile here. lab.trace: an int64 tensor of >= programs x TRACE_COLS entries receives the
    phase stamps (TRACE_LAYOUT; row (b * head blocks + hb) * splits + split)."""
    p = plan.p
    kc = consts(plan, lab)
    extra = {}
    if lab.trace is not None:
        n = plan.p.b * plan.n_hblk * plan.num_splits * TRACE_COLS
        trace = lab.trace
        if trace.dtype != torch.int64 or trace.numel() < n or not trace.is_contiguous():
            raise ValueError(f"trace must be a contiguous int64 tensor of >= {n} entries")
        extra = dict(trace_ptr=trace, TRACE=True)
    # (kc stays the failure cache's key, as serves() builds it; the launch's own copy
    # says which grid order ran)
    run = dict(kc)
    grid = gluon_common.grid_order(run, plan.grid, p.num_sms)
    so, sl = plan.so, plan.sl
    try:
        return _sparse_mla_split_gluon_ws_kernel[grid](
            p.q, p.kv, p.indices, plan.o_dst, plan.lse_dst, p.h, p.topk, plan.tiles_per_split,
            p.q.stride(0) // 8, p.q.stride(1) // 8, p.kv.stride(0) // 8, p.indices.stride(0),
            so[0], so[1], so[2], sl[0], sl[1], plan.scale_log2, **run, **extra,
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - any compile failure: recorded, dispatch decides
        raise gluon_common.compile_failed(e, kc, p.q, "warp-specialised Gluon split kernel") from e
