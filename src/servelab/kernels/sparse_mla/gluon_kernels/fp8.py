"""Split-KV sparse MLA decode over the FP8 cache (fp8.py's layout), written in Gluon, Hopper only.

A one-partition bf16 Gluon kernel (removed; never a default) kept one 64-token tile in flight
per SM: q (64 KB) and the slot being computed filled the rest of shared memory. Here the ring holds the FP8 rows
(e4m3 part, rope, scales: 656 or 604 bytes a row instead of 1152 or 1024), and each tile is
dequantised once, by all threads, into one fp16 staging tile that both wgmma dots read:

- top of tile j: wait for its gather, and for tile j - 1's P V dot (which read the staging
  tile); dequantise ring slot j into the staging tile (each e4m3 chunk converted to fp16,
  exact, times its row's scale rounded to fp16; on the V4 layout the rope columns are
  copied in after the e4m3 part); then the slot is free and tile j + NBUF's gather is issued
  into it;
- so NBUF tiles are in flight while a tile's dots run (the bf16 ring: NBUF - 1), twice the
  rows in about 60-75% of the bytes at NBUF = 2;
- the scores, the online softmax, the P V dot and the partials use gluon_kernels/common.py's helpers.

Values: the dots run in fp16 (q, the staging tile and P; fp8.py says what range that needs):
e4m3 -> fp16 is one cvt per two values and the scale one paired fp16 multiply, a third of the
conversion instructions of scaling in fp32 and rounding to bf16 (2-7% of the call at B >= 32
on the H200). q lands by cp.async in the staging tile (as its own dtype, in flight with the
first gathers) and is converted into its fp16 buffer before the first tile.
V3.2 layout (e4m3 part = d_v columns, rope = the score-only tail): the tail dot reads the rope
ring slot, so the next gather is issued after the score dot. V4 layout (e4m3 part + rope =
d_v = D_qk): the rope is part of V and goes into the staging tile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton

from ..splitkv.lab import GLUON_DROP
from . import common as gluon_common
from .common import AVAILABLE

if TYPE_CHECKING:
    from ..fp8 import Fp8KVCache
    from ..splitkv.lab import Lab
    from ..splitkv.plan import LaunchPlan

if AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )

    from .common import (
        _cp_load,
        _cta_barrier,
        _load_q,
        _load_split_indices,
        _program_ids,
        _score,
        _split_tiles,
        _store_lse,
        _store_out,
        _store_staged,
        _view_as,
    )

    @gluon.constexpr_function
    def _fp8_regs(cw, num_warps):
        """Registers of an e4m3 chunk of `cw` columns: 16 values (16 bytes) a thread, at most 4
        threads along a row. A 128-bit shared access is served 8 threads at a time; with 8
        threads along a 128-column row (V3.2's chunks) those 8 wrote one row's fp16 values to
        the swizzled staging tile's same 4 bank groups twice over (2-way conflicts: Nsight
        Compute counted 2.15 M conflicts in 4.48 M store wavefronts, H 16 B = 128); rows two
        at a time fill all 8. Chunks of 64 columns keep their 8 x 4 threads."""
        tpc = min(cw // 16, 4)
        return gl.BlockedLayout([1, 16], [32 // tpc, tpc], [num_warps, 1], [1, 0])

    @gluon.constexpr_function
    def _fp8_ring_layout(cw):
        """The e4m3 ring's shared layout for _fp8_regs: with 4 threads a row, the two rows of an
        8-thread phase would hit the same banks of 128-byte rows; swapping odd rows' 64-byte
        halves puts them side by side (chunks wider than 64 columns; 64 columns stay
        unswizzled). tests/kernels/sparse_mla/gluon_kernels/test_fp8.py models both layouts' banks."""
        if cw > 64:
            return gl.SwizzledSharedLayout(64, 1, cw // 64, [1, 0])
        return gl.SwizzledSharedLayout(1, 1, 1, [1, 0])

    @gluon.jit
    def _issue_gather_fp8(d8_ring, rope_ring, sc_ring, idx_smem, d8_ptr, rope_ptr, sc_ptr, jn,
                          t_start, n_local, n_lim, stride_d16, stride_r8, stride_s,
                          D_FP8: gl.constexpr, CW: gl.constexpr, NCH: gl.constexpr,
                          NSC: gl.constexpr, D_ROPE: gl.constexpr, BLOCK_N: gl.constexpr,
                          NBUF: gl.constexpr, l8: gl.constexpr, lr: gl.constexpr,
                          ls: gl.constexpr, SKIP: gl.constexpr = False):  # fmt: skip
        """cp.async of tile jn's FP8 rows (e4m3 chunks, rope, scales) into ring slot
        jn % NBUF, as one commit group; tiles past the split are masked off (zero-filled, no
        traffic), so the ring advances by one group per tile. SKIP (the no-gathers
        diagnostic): an empty group."""
        if SKIP:
            cp.commit_group()
            return
        row = idx_smem.index(gl.maximum(gl.minimum(jn, n_local - 1), 0))
        slot = jn % NBUF
        base = (t_start + jn) * BLOCK_N
        rid = row.load(gl.SliceLayout(1, l8))
        ok = (base + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, l8)) < n_lim) & (rid >= 0)
        rows = gl.where(ok, rid, 0).to(gl.int64) * (stride_d16 * 16)
        offs_c = gl.arange(0, CW, layout=gl.SliceLayout(0, l8))
        for c in gl.static_range(NCH):
            _cp_load(d8_ring.index(slot * NCH + c),
                     d8_ptr + rows[:, None] + c * CW + offs_c[None, :], mask=ok[:, None])  # fmt: skip
        rid_r = row.load(gl.SliceLayout(1, lr))
        ok_r = (base + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, lr)) < n_lim) & (rid_r >= 0)
        rows_r = gl.where(ok_r, rid_r, 0).to(gl.int64) * (stride_r8 * 8)
        offs_r = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, lr))
        _cp_load(rope_ring.index(slot), rope_ptr + rows_r[:, None] + offs_r[None, :],
                 mask=ok_r[:, None])  # fmt: skip
        rid_s = row.load(gl.SliceLayout(1, ls))
        ok_s = (base + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ls)) < n_lim) & (rid_s >= 0)
        rows_s = gl.where(ok_s, rid_s, 0).to(gl.int64) * stride_s
        offs_s = gl.arange(0, NSC, layout=gl.SliceLayout(0, ls))
        _cp_load(sc_ring.index(slot), sc_ptr + rows_s[:, None] + offs_s[None, :],
                 mask=ok_s[:, None] & (offs_s < NCH)[None, :])  # fmt: skip
        cp.commit_group()

    @gluon.jit
    def _dequant_tile(kv_st, d8_ring, rope_ring, sc_ring, slot, D_FP8: gl.constexpr,
                      CW: gl.constexpr, NCH: gl.constexpr, D_ROPE: gl.constexpr,
                      ROPE_IN_V: gl.constexpr, l8: gl.constexpr, lr: gl.constexpr):  # fmt: skip
        """Ring slot -> the fp16 staging tile: chunk c of the e4m3 part converted to fp16
        (exact: two values per cvt.rn.f16x2.e4m3x2) times each row's scale c rounded to fp16,
        one fp16 multiply per value; on the V4 layout the rope columns after it."""
        for c in gl.static_range(NCH):
            x = d8_ring.index(slot * NCH + c).load(l8)
            s = sc_ring.index(slot).slice(c, 1, dim=1).load(l8)  # [BLOCK_N, 1]
            kv_st.slice(c * CW, CW, dim=1).store(x.to(gl.float16) * s.to(gl.float16))
        if ROPE_IN_V:
            kv_st.slice(D_FP8, D_ROPE, dim=1).store(rope_ring.index(slot).load(lr).to(gl.float16))

    @gluon.jit
    def _fp8_ring_start(q_smem, q_land, d8_ring, rope_ring, sc_ring, idx_smem, d8_ptr,
                        rope_ptr, sc_ptr, t_start, n_local, n_lim, stride_d16, stride_r8,
                        stride_s, D_FP8: gl.constexpr, CW: gl.constexpr, NCH: gl.constexpr,
                        NSC: gl.constexpr, D_ROPE: gl.constexpr, BLOCK_N: gl.constexpr,
                        NBUF: gl.constexpr, l8: gl.constexpr, lr: gl.constexpr,
                        ls: gl.constexpr, ld: gl.constexpr):  # fmt: skip
        """After the indices: the first NBUF tiles' gathers, then q (landed in the staging
        tile) converted into its fp16 buffer (the loop's barriers order it before the dots)."""
        for j in gl.static_range(NBUF):
            _issue_gather_fp8(d8_ring, rope_ring, sc_ring, idx_smem, d8_ptr, rope_ptr, sc_ptr,
                              j, t_start, n_local, n_lim, stride_d16, stride_r8, stride_s,
                              D_FP8, CW, NCH, NSC, D_ROPE, BLOCK_N, NBUF, l8, lr, ls)  # fmt: skip
        cp.wait_group(NBUF)  # q landed (the gathers stay in flight)
        _cta_barrier()
        q_smem.store(q_land.load(ld).to(q_smem.dtype))

    @gluon.jit
    def _fp8_stage(acc, j, kv_st, d8_ring, rope_ring, sc_ring, idx_smem, d8_ptr, rope_ptr,
                   sc_ptr, t_start, n_local, n_lim, stride_d16, stride_r8, stride_s,
                   D_FP8: gl.constexpr, CW: gl.constexpr, NCH: gl.constexpr,
                   NSC: gl.constexpr, D_ROPE: gl.constexpr, ROPE_IN_V: gl.constexpr,
                   BLOCK_N: gl.constexpr, NBUF: gl.constexpr, l8: gl.constexpr,
                   lr: gl.constexpr, ls: gl.constexpr, DROP: gl.constexpr):  # fmt: skip
        """Top of tile j: wait for its gather and for tile j - 1's P V (which read the staging
        tile; returned, waited), dequantise ring slot j into the staging tile, and on the V4
        layout (the slot now read) issue tile j + NBUF's gather into it."""
        cp.wait_group(NBUF - 1)  # tile j landed (this thread's copies)
        o_j = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))  # P V read the staging
        _cta_barrier()  # everyone's copies landed, every warp done with the staging tile
        if DROP != 3:
            _dequant_tile(kv_st, d8_ring, rope_ring, sc_ring, j % NBUF, D_FP8, CW, NCH, D_ROPE,
                          ROPE_IN_V, l8, lr)  # fmt: skip
        fence_async_shared()  # this thread's staging writes visible to wgmma,
        _cta_barrier()  # ...everyone's; the slot is read
        if ROPE_IN_V:
            _fp8_refill(d8_ring, rope_ring, sc_ring, idx_smem, d8_ptr, rope_ptr, sc_ptr, j,
                        t_start, n_local, n_lim, stride_d16, stride_r8, stride_s, D_FP8, CW,
                        NCH, NSC, D_ROPE, BLOCK_N, NBUF, l8, lr, ls, DROP)  # fmt: skip
        return o_j

    @gluon.jit
    def _fp8_refill(d8_ring, rope_ring, sc_ring, idx_smem, d8_ptr, rope_ptr, sc_ptr, j,
                    t_start, n_local, n_lim, stride_d16, stride_r8, stride_s,
                    D_FP8: gl.constexpr, CW: gl.constexpr, NCH: gl.constexpr,
                    NSC: gl.constexpr, D_ROPE: gl.constexpr, BLOCK_N: gl.constexpr,
                    NBUF: gl.constexpr, l8: gl.constexpr, lr: gl.constexpr, ls: gl.constexpr,
                    DROP: gl.constexpr):  # fmt: skip
        """Tile j + NBUF's gather into tile j's ring slot (DROP == 1: an empty group)."""
        _issue_gather_fp8(d8_ring, rope_ring, sc_ring, idx_smem, d8_ptr, rope_ptr, sc_ptr,
                          j + NBUF, t_start, n_local, n_lim, stride_d16, stride_r8, stride_s,
                          D_FP8, CW, NCH, NSC, D_ROPE, BLOCK_N, NBUF, l8, lr, ls,
                          DROP == 1)  # fmt: skip

    @gluon.jit
    def _q_landing(kv_st, dtype: gl.constexpr, BLOCK_H: gl.constexpr):
        """The first BLOCK_H rows of the (not yet used) fp16 staging tile, seen as q's 16-bit
        dtype: q lands there by cp.async (in flight with the first gathers) and is converted
        to fp16 into its own buffer before the first tile."""
        shape: gl.constexpr = kv_st.shape
        gl.static_assert(BLOCK_H <= shape[0], "q must fit in the staging tile's rows")
        view = _view_as(kv_st, dtype, shape[0], shape[1],
                        gl.NVMMASharedLayout.get_default_for(shape, dtype))  # fmt: skip
        return view.slice(0, BLOCK_H, dim=0)

    @gluon.jit
    def _sparse_mla_split_gluon_fp8_kernel(
        q_ptr,  # [B, H, D_qk]
        d8_ptr,  # [T, D_FP8] e4m3
        rope_ptr,  # [T, D_ROPE] q's dtype
        sc_ptr,  # [T, NCH] fp32
        idx_ptr,  # [B, topk] int32
        o_ptr,  # final [B, H, d_v] or partial [B, S, H, d_v]
        lse_ptr,  # final [B, H] or partial [B, S, H] fp32
        H,
        topk,
        tiles_per_split,
        stride_qb8,  # q's strides / 8 and the rope rows' / 8 (16-byte units of 16-bit
        stride_qh8,  # values), the e4m3 rows' / 16: cp.async moves 16 B
        stride_d16,
        stride_r8,
        stride_s,
        stride_ib,
        stride_ob,
        stride_os,
        stride_oh,
        stride_lb,
        stride_ls,
        scale_log2,
        D_V: gl.constexpr,
        D_FP8: gl.constexpr,  # e4m3 columns = NCH x CW
        CW: gl.constexpr,  # scale tile (columns per scale)
        NCH: gl.constexpr,
        NSC: gl.constexpr,  # NCH padded to a power of two
        D_ROPE: gl.constexpr,  # 16-bit columns after the e4m3 part
        ROPE_IN_V: gl.constexpr,  # V4 layout (D_FP8 + D_ROPE = D_V); else V3.2 (tail)
        BLOCK_H: gl.constexpr,  # 64: one wgmma M
        BLOCK_N: gl.constexpr,
        NBUF: gl.constexpr,  # ring depth: NBUF gathers in flight during a tile's dots
        MAX_T: gl.constexpr,  # power of two >= tiles per split
        num_warps: gl.constexpr,
        DROP: gl.constexpr = 0,  # diagnostics (wrong results): 1 no gathers in the loop,
        # 2 no dots, 3 no dequantisation
        STAGED: gl.constexpr = False,  # 16-bit O stored through the staging tile
    ):
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        D_TAIL: gl.constexpr = 0 if ROPE_IN_V else D_ROPE
        # Register layouts: 16-byte vectors for the e4m3 chunks, the rope, q.
        l8: gl.constexpr = _fp8_regs(CW, num_warps)
        lr: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D_ROPE // 8), D_ROPE // 8],
                                            [num_warps, 1], [1, 0])  # fmt: skip
        ls: gl.constexpr = gl.BlockedLayout([1, 1], [32 // NSC, NSC], [num_warps, 1], [1, 0])
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
        ix: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
        s_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_N // 2, 16])
        o_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, D_V // 2, 16])
        p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
        cdt: gl.constexpr = gl.float16  # q, the staging tile and P (the dots' operands)
        sh_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], cdt)
        sh_q: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_V], cdt)
        sh_r: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_ROPE], dtype)
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        sh_ix: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])

        b, hb, _ = _program_ids(False)
        sp = gl.program_id(2)
        t_start, n_local, n_lim = _split_tiles(topk, tiles_per_split, BLOCK_N)

        idx_smem = gl.allocate_shared_memory(gl.int32, [MAX_T, BLOCK_N], sh_ix)
        _load_split_indices(idx_smem, idx_ptr + b * stride_ib, t_start, n_local, n_lim, BLOCK_N,
                            gl.SliceLayout(0, ix))  # fmt: skip
        cp.commit_group()
        q_smem = gl.allocate_shared_memory(cdt, [BLOCK_H, D_V], sh_q)
        kv_st = gl.allocate_shared_memory(cdt, [BLOCK_N, D_V], sh_kv)
        q_land = _q_landing(kv_st, dtype, BLOCK_H)
        q_row = q_ptr + b * (stride_qb8 * 8)
        _load_q(q_land, q_row, hb, H, stride_qh8, D_V, BLOCK_H, ld)
        cp.commit_group()
        d8_ring = gl.allocate_shared_memory(d8_ptr.dtype.element_ty, [NBUF * NCH, BLOCK_N, CW],
                                            _fp8_ring_layout(CW))  # fmt: skip
        rope_ring = gl.allocate_shared_memory(dtype, [NBUF, BLOCK_N, D_ROPE], sh_r)
        sc_ring = gl.allocate_shared_memory(gl.float32, [NBUF, BLOCK_N, NSC], flat)
        if D_TAIL > 0:  # the q tail (the rope columns) in registers, as in gluon_kernels/common.py
            offs_h_lr = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, lr))
            offs_r_lr = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, lr))
            qt = gl.load(q_row + offs_h_lr[:, None] * (stride_qh8 * 8) + D_V
                         + offs_r_lr[None, :], mask=(offs_h_lr < H)[:, None],
                         other=0.0)  # fmt: skip
            qt_op = gl.convert_layout(qt, gl.DotOperandLayout(0, s_l, 2))
        else:
            qt_op = gl.zeros([BLOCK_H, D_ROPE], dtype, layout=lr)  # unused
        cp.wait_group(1)  # the indices (q may still be in flight)
        _cta_barrier()

        _fp8_ring_start(q_smem, q_land, d8_ring, rope_ring, sc_ring, idx_smem, d8_ptr, rope_ptr,
                        sc_ptr, t_start, n_local, n_lim, stride_d16, stride_r8, stride_s, D_FP8,
                        CW, NCH, NSC, D_ROPE, BLOCK_N, NBUF, l8, lr, ls, ld)  # fmt: skip

        m_i = gl.full([BLOCK_H], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_l))
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_l))
        acc = warpgroup_mma_init(gl.zeros([BLOCK_H, D_V], gl.float32, layout=o_l))
        s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_l)
        offs_n_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_l))
        for j in range(0, n_local):
            buf = j % NBUF
            o_j = _fp8_stage(acc, j, kv_st, d8_ring, rope_ring, sc_ring, idx_smem, d8_ptr,
                             rope_ptr, sc_ptr, t_start, n_local, n_lim, stride_d16, stride_r8,
                             stride_s, D_FP8, CW, NCH, NSC, D_ROPE, ROPE_IN_V, BLOCK_N, NBUF,
                             l8, lr, ls, DROP)  # fmt: skip
            s = _score(q_smem, qt_op, kv_st, rope_ring.index(buf), s_zero, D_TAIL, DROP)
            if D_TAIL > 0:  # the tail dot read the rope slot: refill it only now
                _cta_barrier()
                _fp8_refill(d8_ring, rope_ring, sc_ring, idx_smem, d8_ptr, rope_ptr, sc_ptr, j,
                            t_start, n_local, n_lim, stride_d16, stride_r8, stride_s, D_FP8,
                            CW, NCH, NSC, D_ROPE, BLOCK_N, NBUF, l8, lr, ls, DROP)  # fmt: skip
            valid = ((t_start + j) * BLOCK_N + offs_n_s < n_lim) & (
                idx_smem.index(j).load(gl.SliceLayout(0, s_l)) >= 0)
            s = gl.where(valid[None, :], s * scale_log2, -float("inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_safe = gl.where(m_new == -float("inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_safe)
            p = gl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            o_j = o_j * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
            p_op = gl.convert_layout(p.to(cdt), p_l)
            if DROP == 2:
                acc = warpgroup_mma_init(o_j)
            else:
                acc = warpgroup_mma(p_op, kv_st, o_j, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        cp.wait_group(0)

        o_row = o_ptr + b * stride_ob + sp * stride_os
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_l))
        odt: gl.constexpr = o_ptr.dtype.element_ty
        if STAGED and odt.primitive_bitwidth == 16 and BLOCK_N >= BLOCK_H:
            # 16-bit O (the output at one split, or 16-bit partials) through the staging tile,
            # once both warpgroups' last P V has read it (gluon_common._store_staged).
            _cta_barrier()
            o = acc / gl.where(l_o > 0.0, l_o, 1.0)[:, None]
            _store_staged(o_row, o.to(odt), kv_st, hb, H, stride_oh, 0, D_V, BLOCK_H)
        else:
            _store_out(o_row, acc, l_o, hb, H, stride_oh, 0, D_V, BLOCK_H, o_l)
        _store_lse(lse_ptr + b * stride_lb + sp * stride_ls, m_i, l_i, hb, H, BLOCK_H,
                   gl.SliceLayout(1, s_l))  # fmt: skip




DROPS = ("", "gather", "dots", "dequant")  # the lab diagnostics this kernel implements


def consts(plan: LaunchPlan, lab: Lab) -> dict:
    """The kernel's compile-time arguments for a launch (its compile cache key). STAGED (a
    lab switch, shipped on): 16-bit O (the output at one split, 16-bit partials) stored
    through the staging tile in whole row segments, as gluon_ws does (ninth follow-up)."""
    cache, cfg = plan.p.kv, plan.cfg
    nch = cache.d_fp8 // cache.tile
    return dict(D_V=plan.p.d_v, D_FP8=cache.d_fp8, CW=cache.tile, NCH=nch,
                NSC=max(triton.next_power_of_2(nch), 4), D_ROPE=cache.d_qk - cache.d_fp8,
                ROPE_IN_V=cache.d_fp8 < plan.p.d_v, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
                NBUF=cfg.num_stages, MAX_T=triton.next_power_of_2(plan.tiles_per_split),
                num_warps=8, DROP=GLUON_DROP.get(lab.drop, 0),
                STAGED=lab.staged_stores)  # fmt: skip


def smem_bytes(kc: dict) -> int:
    """Shared memory the kernel asks for (q, staging, ring, indices) plus 8 KB of scratch
    (the softmax's cross-warpgroup reductions, P's layout conversion)."""
    bn, elem = kc["BLOCK_N"], 2
    ring = bn * (kc["D_FP8"] + elem * kc["D_ROPE"] + 4 * kc["NSC"])
    return (elem * kc["D_V"] * (kc["BLOCK_H"] + bn) + kc["NBUF"] * ring
            + 4 * kc["MAX_T"] * bn + 8 * 1024)  # fmt: skip


def layout_ok(q: torch.Tensor, cache: Fp8KVCache, d_v: int) -> bool:
    """The FP8 layouts the Gluon FP8 kernels read: a scale tile of 64 or 128 columns and a
    power-of-two rope of 32-256 columns (the 16-byte gather layouts then cover 64 rows without
    replicated copies), either layout (e4m3 part = d_v, or e4m3 + rope = d_v = D_qk), the rope
    in q's 16-bit dtype, and 16-byte rows for cp.async."""
    d_rope = cache.d_qk - cache.d_fp8
    if not (cache.tile in (64, 128) and 32 <= d_rope <= 256 and d_rope & (d_rope - 1) == 0
            and (cache.d_fp8 == d_v or cache.d_fp8 + d_rope == d_v)
            and q.element_size() == 2 and cache.rope.dtype == q.dtype):  # fmt: skip
        return False
    return gluon_common.rows_aligned(
        (q.stride(0), 8), (q.stride(1), 8), (cache.data.stride(0), 16), (cache.rope.stride(0), 8),
        tensors=(q, cache.data, cache.rope))  # fmt: skip


def serves(plan: LaunchPlan, lab: Lab) -> bool:
    """Whether this kernel can run the launch: an FP8 cache of a layout it reads
    (`layout_ok`); 64-head tiles over 8 warps, 64-token tiles; d_v a power of two in
    32..512; then gluon_common.usable (Hopper, shared memory, no earlier compile failure)."""
    p, cfg = plan.p, plan.cfg
    if not p.fp8 or lab.drop not in DROPS:
        return False
    if not (cfg.block_h == 64 and cfg.num_warps == 8 and cfg.block_n == 64
            and cfg.num_stages >= 1 and 32 <= p.d_v <= 512 and p.d_v & (p.d_v - 1) == 0
            and layout_ok(p.q, p.kv, p.d_v)):  # fmt: skip
        return False
    kc = consts(plan, lab)
    return gluon_common.usable(plan, kc, smem_bytes(kc))


def launch(plan: LaunchPlan, lab: Lab):
    """Launch the kernel; the compiled kernel; raises gluon_common.CompileFailed (after a one-time
    warning) if it does not compile here. (Grid (B, head blocks, splits): a request's head blocks side by side gained
    nothing here, the kernel being bound by its dequantisation rather than its bytes; H200,
    tenth follow-up: V3.2 B = 128 249.45 -> 248.35 us.)"""
    p, cache = plan.p, plan.p.kv
    kc = consts(plan, lab)
    so, sl = plan.so, plan.sl
    try:
        return _sparse_mla_split_gluon_fp8_kernel[plan.grid](
            p.q, cache.data, cache.rope, cache.scale, p.indices, plan.o_dst, plan.lse_dst, p.h,
            p.topk, plan.tiles_per_split, p.q.stride(0) // 8, p.q.stride(1) // 8,
            cache.data.stride(0) // 16, cache.rope.stride(0) // 8, cache.scale.stride(0),
            p.indices.stride(0), so[0], so[1], so[2], sl[0], sl[1], plan.scale_log2, **kc,
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - any compile failure: recorded, dispatch decides
        raise gluon_common.compile_failed(e, kc, p.q, "FP8 Gluon split kernel") from e
