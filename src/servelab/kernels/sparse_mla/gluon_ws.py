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

from . import gluon_common
from .gluon_common import AVAILABLE
from .gluon_ws_trace import TRACE_COLS, TRACE_LAYOUT, TRACE_TILES  # noqa: F401
from .lab import GLUON_DROP

if TYPE_CHECKING:
    from .lab import Lab
    from .plan import LaunchPlan

if AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from .gluon_common import (
        _cp_load,
        _cta_barrier,
        _load_q,
        _program_ids,
        _split_tiles,
        _store_lse,
        _store_out,
        _store_staged,
    )
    from .gluon_ws_trace import (
        T_COLS,
        T_ENTRY,
        T_IDX0,
        T_LANDED,
        T_LOADER_END,
        T_P_READY,
        T_PV1,
        T_PV2,
        T_Q,
        T_READY,
        T_SCORED,
        T_SCORER_END,
        T_SCORER_STORED,
        T_SECOND_END,
        T_SECOND_STORED,
        T_SM,
        T_TILES,
        _stamp,
    )

    @gluon.jit
    def _tile_idx(idx_row, p0, n_lim, BLOCK_N: gl.constexpr, layout: gl.constexpr):
        """The indices of the tile at token position p0 in `layout` (-1 past the split, like
        padding)."""
        pos = p0 + gl.arange(0, BLOCK_N, layout=layout)
        return gl.load(idx_row + pos, mask=pos < n_lim, other=-1)

    @gluon.jit
    def _store_half(o_row, acc, l_o, kbuf, buf, hb, H, stride_oh, COL0: gl.constexpr,
                    D: gl.constexpr, BLOCK_H: gl.constexpr, layout: gl.constexpr,
                    STAGED: gl.constexpr):  # fmt: skip
        """acc / l (rows with nothing stay 0) -> columns [COL0, COL0 + D) of this head block's
        output rows; STAGED: through K buffer `buf` (free by then), gluon_common's
        _store_staged."""
        if STAGED:
            o = acc / gl.where(l_o > 0.0, l_o, 1.0)[:, None]
            _store_staged(o_row, o.to(o_row.dtype.element_ty), kbuf.index(buf), hb, H,
                          stride_oh, COL0, D, BLOCK_H)  # fmt: skip
        else:
            _store_out(o_row, acc, l_o, hb, H, stride_oh, COL0, D, BLOCK_H, layout)

    @gluon.jit
    def _loader(kbuf, ktail, idx_ring, k_ready, k_free, idx_bar, kv_ptr, idx_row, p_start, n_local,
                n_lim, stride_kvt8, D_V: gl.constexpr, D_TAIL: gl.constexpr,
                BLOCK_T: gl.constexpr, BLOCK_N: gl.constexpr, NK: gl.constexpr,
                DROP: gl.constexpr, tr, TRACE: gl.constexpr):  # fmt: skip
        """Worker: tile j's rows -> K buffer j % NK by cp.async, once both consumers released
        the buffer's previous tile, and its indices -> idx_ring (the scorer's mask). With
        LAG = NK - 2, tile j's k_ready is signalled after tile j + LAG is issued (cp.async
        groups complete in order): up to NK - 1 tiles in flight while the consumers hold one
        buffer (LAG = NK - 1 was measured: with NK = 2 it delays every k_ready by one tile's
        issue, 2-12% slower). Padding rows and positions past the split are
        zero-filled (no memory traffic). The next tile's indices are loaded while this tile's
        copies are issued."""
        LAG: gl.constexpr = NK - 2
        nw: gl.constexpr = gl.num_warps()
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [nw, 1], [1, 0])
        ld_t: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [nw, 1], [1, 0])
        ix: gl.constexpr = gl.BlockedLayout([1], [32], [nw], [0])
        offs_d = gl.arange(0, D_V, layout=gl.SliceLayout(0, ld))
        offs_t = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, ld_t))
        rid = _tile_idx(idx_row, p_start, n_lim, BLOCK_N, gl.SliceLayout(1, ld))
        rid_t = _tile_idx(idx_row, p_start, n_lim, BLOCK_N, gl.SliceLayout(1, ld_t))
        rid_x = _tile_idx(idx_row, p_start, n_lim, BLOCK_N, ix)
        for j in range(0, n_local):
            buf = j % NK
            mbarrier.wait(k_free.index(buf), (j // NK + 1) & 1, pred=j >= NK)
            idx_ring.index(buf).store(rid_x)
            _stamp(tr, T_IDX0, TRACE, j == 0)  # (the first tile's indices are in registers)
            mbarrier.arrive(idx_bar, pred=j == 0)  # the scorer may issue q's copies now
            ok = (rid >= 0) & (DROP != 1)  # (DROP 1: no gathers, timing only)
            rows = gl.where(ok, rid, 0).to(gl.int64) * (stride_kvt8 * 8)
            _cp_load(kbuf.index(buf), kv_ptr + rows[:, None] + offs_d[None, :], mask=ok[:, None])
            if D_TAIL > 0:
                ok_t = (rid_t >= 0) & (DROP != 1)
                rows_t = gl.where(ok_t, rid_t, 0).to(gl.int64) * (stride_kvt8 * 8)
                _cp_load(ktail.index(buf), kv_ptr + rows_t[:, None] + D_V + offs_t[None, :],
                         mask=ok_t[:, None] & (offs_t < D_TAIL)[None, :])  # fmt: skip
            cp.commit_group()
            p_next = p_start + (j + 1) * BLOCK_N
            rid = _tile_idx(idx_row, p_next, n_lim, BLOCK_N, gl.SliceLayout(1, ld))
            rid_x = _tile_idx(idx_row, p_next, n_lim, BLOCK_N, ix)
            if D_TAIL > 0:
                rid_t = _tile_idx(idx_row, p_next, n_lim, BLOCK_N,
                                  gl.SliceLayout(1, ld_t))  # fmt: skip
            if j >= LAG:  # tile j - LAG landed (this thread's copies), ...
                cp.wait_group(LAG)
                fence_async_shared()  # ... visible to the consumers' wgmma, ...
                _cta_barrier()  # ... for all of this partition's threads
                _stamp(tr, T_LANDED + j - LAG, TRACE, j - LAG < T_TILES)
                mbarrier.arrive(k_ready.index((j - LAG) % NK))
        if LAG > 0:
            cp.wait_group(0)
            fence_async_shared()
            _cta_barrier()
            for jr in range(gl.maximum(n_local - LAG, 0), n_local):
                _stamp(tr, T_LANDED + jr, TRACE, jr < T_TILES)
                mbarrier.arrive(k_ready.index(jr % NK))
        _stamp(tr, T_LOADER_END, TRACE)

    @gluon.jit
    def _scorer(q_smem, kbuf, ktail, idx_ring, s_p, s_alpha, l_smem, k_ready, k_free, p_ready,
                p_free, done, idx_bar, q_ptr, stride_qb8, stride_qh8, o_ptr, lse_ptr, b, hb, sp, H,
                p_start, n_local, n_lim, stride_ob, stride_os, stride_oh, stride_lb, stride_ls,
                scale_log2, D_V: gl.constexpr, D_TAIL: gl.constexpr, BLOCK_T: gl.constexpr,
                BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, NK: gl.constexpr,
                DROP: gl.constexpr, tr, TRACE: gl.constexpr,
                STAGED: gl.constexpr, Q_LATE: gl.constexpr):  # fmt: skip
        """Default partition: scores, softmax, P for the second half, P V for d_v[:D_V/2].
        (Leaving tile j's P V in flight under tile j + 1's score dot, releasing its K buffer
        after that, was measured: 1.18-1.30x slower at B = 32-128, H200 2026-11-30.)"""
        dtype: gl.constexpr = q_smem.dtype
        nw: gl.constexpr = gl.num_warps()
        s_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[nw, 1], instr_shape=[16, BLOCK_N, 16])
        o_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[nw, 1], instr_shape=[16, D_V // 2, 16])
        p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
        if D_TAIL > 0:  # the q tail as the score dot's A operand, in registers
            ld_t: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [nw, 1], [1, 0])
            offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld_t))
            offs_t = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, ld_t))
            qt = gl.load(q_ptr + b * (stride_qb8 * 8) + offs_h[:, None] * (stride_qh8 * 8) + D_V
                         + offs_t[None, :],
                         mask=(offs_h < H)[:, None] & (offs_t < D_TAIL)[None, :], other=0.0)  # fmt: skip
            qt_op = gl.convert_layout(qt, gl.DotOperandLayout(0, s_l, 2))
        m_i = gl.full([BLOCK_H], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_l))
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_l))
        acc = gl.zeros([BLOCK_H, D_V // 2], gl.float32, layout=o_l)
        s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_l)
        if Q_LATE:  # q's copies behind the loader's first index load, beside its first gathers
            mbarrier.wait(idx_bar, 0, pred=n_local > 0)
            ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [nw, 1], [1, 0])
            _load_q(q_smem, q_ptr + b * (stride_qb8 * 8), hb, H, stride_qh8, D_V, BLOCK_H, ld)
            cp.commit_group()
        cp.wait_group(0)  # q (this partition's copies), while the loader's first gathers fly
        fence_async_shared()
        _cta_barrier()
        _stamp(tr, T_Q, TRACE)
        for j in range(0, n_local):
            buf = j % NK
            mbarrier.wait(k_ready.index(buf), (j // NK) & 1)
            _stamp(tr, T_READY + j, TRACE, j < T_TILES)
            kj = kbuf.index(buf)
            if DROP == 2:  # (no dots, timing only)
                s = s_zero
            else:
                s = warpgroup_mma(q_smem, kj.permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)  # fmt: skip
                if D_TAIL > 0:
                    s = warpgroup_mma(qt_op, ktail.index(buf).permute((1, 0)), s, is_async=True)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            _stamp(tr, T_SCORED + j, TRACE, j < T_TILES)
            valid = idx_ring.index(buf).load(gl.SliceLayout(0, s_l)) >= 0  # (-1 past the split)
            s = gl.where(valid[None, :], s * scale_log2, -float("inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_safe = gl.where(m_new == -float("inf"), 0.0, m_new)  # all padding so far
            alpha = gl.exp2(m_i - m_safe)
            p = gl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            pb = p.to(dtype)
            # P and the rescale factor for the second half, once it is done with tile j - 1's.
            mbarrier.wait(p_free, (j + 1) & 1, pred=j > 0)
            s_p.store(pb)
            s_alpha.store(alpha)
            fence_async_shared()
            _cta_barrier()
            mbarrier.arrive(p_ready)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
            if DROP != 2:
                acc = warpgroup_mma(gl.convert_layout(pb, p_l), kj.slice(0, D_V // 2, dim=1),
                                    acc, is_async=True)  # fmt: skip
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _stamp(tr, T_PV1 + j, TRACE, j < T_TILES)
            _cta_barrier()
            mbarrier.arrive(k_free.index(buf))
        _stamp(tr, T_SCORER_END, TRACE)
        l_smem.store(l_i)
        _cta_barrier()
        mbarrier.arrive(done)
        # Buffer n % NK (n = n_local): tile n - NK's, which both consumers are done with (the
        # second half finished tile n - 2 before this partition's last P V, p_free), or one
        # never filled when n < NK; the last tile's, (n - 1) % NK, stays with the second half.
        # (A split past the last tile, n <= 0, used none: buffers 0 and NK - 1.)
        _store_half(o_ptr + b * stride_ob + sp * stride_os, acc,
                    gl.convert_layout(l_i, gl.SliceLayout(1, o_l)), kbuf,
                    gl.maximum(n_local, 0) % NK, hb, H, stride_oh, 0, D_V // 2, BLOCK_H, o_l,
                    STAGED)  # fmt: skip
        _store_lse(lse_ptr + b * stride_lb + sp * stride_ls, m_i, l_i, hb, H, BLOCK_H,
                   gl.SliceLayout(1, s_l))  # fmt: skip
        _stamp(tr, T_SCORER_STORED, TRACE)

    @gluon.jit
    def _second_half(kbuf, s_p, s_alpha, l_smem, k_free, p_ready, p_free, done, o_ptr, b, hb, sp,
                     H, n_local, stride_ob, stride_os, stride_oh, D_V: gl.constexpr,
                     BLOCK_H: gl.constexpr, NK: gl.constexpr, DROP: gl.constexpr, tr,
                     TRACE: gl.constexpr, STAGED: gl.constexpr):  # fmt: skip
        """Worker: P V for d_v[D_V/2:], P from shared memory."""
        nw: gl.constexpr = gl.num_warps()
        o_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[nw, 1], instr_shape=[16, D_V // 2, 16])
        acc = gl.zeros([BLOCK_H, D_V // 2], gl.float32, layout=o_l)
        for j in range(0, n_local):
            buf = j % NK
            mbarrier.wait(p_ready, j & 1)
            _stamp(tr, T_P_READY + j, TRACE, j < T_TILES)
            alpha = s_alpha.load(gl.SliceLayout(1, o_l))
            acc = acc * alpha[:, None]
            if DROP != 2:
                acc = warpgroup_mma(s_p, kbuf.index(buf).slice(D_V // 2, D_V // 2, dim=1), acc,
                                    is_async=True)  # fmt: skip
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _stamp(tr, T_PV2 + j, TRACE, j < T_TILES)
            _cta_barrier()
            mbarrier.arrive(p_free)
            mbarrier.arrive(k_free.index(buf))
        mbarrier.wait(done, 0)
        _stamp(tr, T_SECOND_END, TRACE)
        # The last tile's buffer: the scorer's last P V read it before `done`.
        _store_half(o_ptr + b * stride_ob + sp * stride_os, acc,
                    l_smem.load(gl.SliceLayout(1, o_l)), kbuf,
                    (gl.maximum(n_local, 0) + NK - 1) % NK, hb, H, stride_oh, D_V // 2, D_V // 2,
                    BLOCK_H, o_l, STAGED)  # fmt: skip
        _stamp(tr, T_SECOND_STORED, TRACE)

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
