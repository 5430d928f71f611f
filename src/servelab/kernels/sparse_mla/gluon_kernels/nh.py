"""Split-KV sparse MLA decode for few heads (the tensor-parallel slices, H <= 32), Gluon, Hopper.

The other Gluon kernels put heads on the wgmma M dimension, whose smallest size is 64: with
16 or 32 heads, 75% or 50% of every dot is padding, and the H16 slice is then bound by the
tensor cores, not by its bytes. Here the dots are transposed ("swap AB"), so the tokens and
d_v fill M and the heads are the N dimension (8..256 in steps of 8):

- scores:  S^T [tokens, heads] = K [tokens, D] @ q^T [D, heads]  (A = the gathered tile);
- output:  O^T [d_v, heads]   += V^T [d_v, tokens] @ P^T [tokens, heads]  (A = the same tile,
  read transposed from shared memory; P^T from shared memory);
- the online softmax reduces over the tokens (axis 0, across the warpgroup's 4 warps).

One warpgroup (4 warps) computes; q takes BLOCK_H x D_qk x 2 bytes of shared memory (32 KB
at 32 heads instead of 64 KB), so the ring holds more tiles in flight. Gathers, the split's
index rows, the ring's commit groups and the partials use gluon_kernels/common.py's helpers; the FP8 kernel takes the FP8 ring and the per-tile dequantisation into one
fp16 staging tile from gluon_kernels/fp8.py (same values; q and P^T in fp16 too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton

from ..splitkv.lab import GLUON_DROP
from . import common as gluon_common
from . import fp8 as gluon_fp8
from .common import AVAILABLE

if TYPE_CHECKING:
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
        _issue_gather,
        _load_q,
        _load_split_indices,
        _split_tiles,
        _store_lse,
    )
    from .fp8 import (
        _fp8_refill,
        _fp8_regs,
        _fp8_ring_layout,
        _fp8_ring_start,
        _fp8_stage,
        _q_landing,
    )

    @gluon.jit
    def _score_t(kv_j, kt_j, q_smem, qt_smem, s_zero, D_TAIL: gl.constexpr, DROP: gl.constexpr):
        """S^T = K q^T (+ the score-only tail) for one tile (DROP == 2: zeros, no dot)."""
        if DROP == 2:
            return s_zero
        s = warpgroup_mma(kv_j, q_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if D_TAIL > 0:
            s = warpgroup_mma(kt_j, qt_smem.permute((1, 0)), s, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=(s,))

    @gluon.jit
    def _softmax_pv(s, valid, m_i, l_i, o_j, v_j, p_smem, scale_log2, dtype: gl.constexpr,
                    DROP: gl.constexpr):  # fmt: skip
        """Online softmax over the tile's tokens (axis 0) for every head (columns), P^T to
        shared memory, and O^T = O^T * alpha + V^T P^T issued asynchronously. Returns the new
        (m, l) and the in-flight accumulator."""
        s = gl.where(valid[:, None], s * scale_log2, -float("inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=0))
        m_safe = gl.where(m_new == -float("inf"), 0.0, m_new)  # all padding so far
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(s - m_safe[None, :])
        l_i = l_i * alpha + gl.sum(p, axis=0)
        o_j = o_j * alpha[None, :]
        p_smem.store(p.to(dtype))
        fence_async_shared()
        _cta_barrier()  # every warp's rows of P^T written before the dot reads them
        if DROP == 2:
            acc = warpgroup_mma_init(o_j)
        else:
            acc = warpgroup_mma(v_j.permute((1, 0)), p_smem, o_j, is_async=True)
        return m_new, l_i, acc

    @gluon.jit
    def _start(q_ptr, idx_ptr, q_dst, b, H, t_start, n_local, n_lim, stride_qb8, stride_qh8,
               stride_ib, D_V: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
               MAX_T: gl.constexpr, ld: gl.constexpr, ix: gl.constexpr):  # fmt: skip
        """The split's index rows into shared memory (one commit group), then q's first D_V
        columns into q_dst (the next group, left open for the caller's q tail); returns
        (index rows, q's row pointer)."""
        idx_smem = gl.allocate_shared_memory(gl.int32, [MAX_T, BLOCK_N],
                                             gl.SwizzledSharedLayout(1, 1, 1, [0]))  # fmt: skip
        _load_split_indices(idx_smem, idx_ptr + b * stride_ib, t_start, n_local, n_lim, BLOCK_N,
                            gl.SliceLayout(0, ix))  # fmt: skip
        cp.commit_group()
        q_row = q_ptr + b * (stride_qb8 * 8)
        _load_q(q_dst, q_row, 0, H, stride_qh8, D_V, BLOCK_H, ld)
        return idx_smem, q_row

    @gluon.jit
    def _finish(o_row, lse_row, acc, m_i, l_i, H, stride_oh, D_V: gl.constexpr,
                BLOCK_H: gl.constexpr, layout: gl.constexpr):  # fmt: skip
        """After the loop: the last P V and any copies done; O^T / l (heads with nothing stay
        0) -> the output rows of heads < H, and their lse."""
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        cp.wait_group(0)
        o = acc / gl.where(l_i > 0.0, l_i, 1.0)[None, :]
        offs_d = gl.arange(0, D_V, layout=gl.SliceLayout(1, layout))
        offs_h = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, layout))
        gl.store(o_row + offs_h[None, :] * stride_oh + offs_d[:, None],
                 o.to(o_row.dtype.element_ty), mask=(offs_h < H)[None, :])  # fmt: skip
        _store_lse(lse_row, m_i, l_i, 0, H, BLOCK_H, gl.SliceLayout(0, layout))

    @gluon.jit
    def _sparse_mla_split_nh_kernel(
        q_ptr,  # [B, H, D_qk]
        kv_ptr,  # [T, D_qk]
        idx_ptr,  # [B, topk] int32
        o_ptr,  # final [B, H, d_v] or partial [B, S, H, d_v]
        lse_ptr,  # final [B, H] or partial [B, S, H] fp32
        H,
        topk,
        tiles_per_split,
        stride_qb8,  # q's and KV's strides / 8 (16-byte units: cp.async moves 16 B)
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
        BLOCK_H: gl.constexpr,  # heads = wgmma N (16 or 32)
        BLOCK_N: gl.constexpr,  # tokens per tile = wgmma M of the score dot (64)
        BLOCK_T: gl.constexpr,  # D_TAIL padded to a power of two >= 16
        NBUF: gl.constexpr,  # ring depth: NBUF - 1 gathers in flight during a tile's dots
        MAX_T: gl.constexpr,  # power of two >= tiles per split
        num_warps: gl.constexpr,  # 4: one warpgroup
        DROP: gl.constexpr = 0,  # diagnostics (wrong results): 1 no gathers in the loop, 2 no dots
    ):
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
        ld_t: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        ix: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
        # S^T [BLOCK_N, BLOCK_H] and O^T [D_V, BLOCK_H]: one warpgroup, heads on N.
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_H, 16])
        sh_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], dtype)
        sh_p: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_H], dtype)

        b = gl.program_id(0)
        sp = gl.program_id(2)
        t_start, n_local, n_lim = _split_tiles(topk, tiles_per_split, BLOCK_N)

        q_smem = gl.allocate_shared_memory(
            dtype, [BLOCK_H, D_V], gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_V], dtype))
        idx_smem, q_row = _start(q_ptr, idx_ptr, q_smem, b, H, t_start, n_local, n_lim,
                                 stride_qb8, stride_qh8, stride_ib, D_V, BLOCK_H, BLOCK_N,
                                 MAX_T, ld, ix)  # fmt: skip
        offs_n_lt = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_t))
        offs_t_lt = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, ld_t))
        kv_smem = gl.allocate_shared_memory(dtype, [NBUF, BLOCK_N, D_V], sh_kv)
        if D_TAIL > 0:
            sh_kt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_T], dtype)
            sh_qt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_T], dtype)
            qt_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, BLOCK_T], sh_qt)
            offs_h_lt = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld_t))
            _cp_load(qt_smem, q_row + offs_h_lt[:, None] * (stride_qh8 * 8) + D_V
                     + offs_t_lt[None, :],
                     mask=(offs_h_lt < H)[:, None] & (offs_t_lt < D_TAIL)[None, :])  # fmt: skip
            kt_smem = gl.allocate_shared_memory(dtype, [NBUF, BLOCK_N, BLOCK_T], sh_kt)
        else:
            qt_smem = q_smem
            kt_smem = kv_smem
        p_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_H], sh_p)
        cp.commit_group()
        cp.wait_group(1)  # the indices (q may still be in flight)
        _cta_barrier()

        offs_d_ld = gl.arange(0, D_V, layout=gl.SliceLayout(0, ld))
        offs_n_ld = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld))
        for j in gl.static_range(NBUF - 1):
            _issue_gather(kv_smem, kt_smem, idx_smem, kv_ptr, j, t_start, n_local, n_lim,
                          stride_kvt8, offs_n_ld, offs_d_ld, offs_n_lt, offs_t_lt,
                          D_V, D_TAIL, BLOCK_N, NBUF, ld, ld_t)  # fmt: skip

        m_i = gl.full([BLOCK_H], -float("inf"), gl.float32, layout=gl.SliceLayout(0, acc_l))
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(0, acc_l))
        acc = warpgroup_mma_init(gl.zeros([D_V, BLOCK_H], gl.float32, layout=acc_l))
        s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=acc_l)
        offs_n_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_l))
        for j in range(0, n_local):
            # The previous tile's P V read the slot refilled below and P^T: let it finish.
            o_j = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _cta_barrier()
            _issue_gather(kv_smem, kt_smem, idx_smem, kv_ptr, j + NBUF - 1, t_start, n_local,
                          n_lim, stride_kvt8, offs_n_ld, offs_d_ld, offs_n_lt, offs_t_lt, D_V,
                          D_TAIL, BLOCK_N, NBUF, ld, ld_t, DROP == 1)  # fmt: skip
            cp.wait_group(NBUF - 1)  # tile j landed (this thread's copies),
            _cta_barrier()  # ...everyone's,
            fence_async_shared()  # ...visible to wgmma
            buf = j % NBUF
            kv_j = kv_smem.index(buf)
            s = _score_t(kv_j, kt_smem.index(buf), q_smem, qt_smem, s_zero, D_TAIL, DROP)
            valid = ((t_start + j) * BLOCK_N + offs_n_s < n_lim) & (
                idx_smem.index(j).load(gl.SliceLayout(1, acc_l)) >= 0)
            m_i, l_i, acc = _softmax_pv(s, valid, m_i, l_i, o_j, kv_j, p_smem, scale_log2,
                                        dtype, DROP)  # fmt: skip
        _finish(o_ptr + b * stride_ob + sp * stride_os, lse_ptr + b * stride_lb + sp * stride_ls,
                acc, m_i, l_i, H, stride_oh, D_V, BLOCK_H, acc_l)  # fmt: skip

    @gluon.jit
    def _sparse_mla_split_nh_fp8_kernel(
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
        stride_qb8,  # as in gluon_kernels/fp8.py
        stride_qh8,
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
        BLOCK_H: gl.constexpr,  # heads = wgmma N
        BLOCK_N: gl.constexpr,
        NBUF: gl.constexpr,  # FP8 ring depth: NBUF gathers in flight during a tile's dots
        MAX_T: gl.constexpr,
        num_warps: gl.constexpr,  # 4
        DROP: gl.constexpr = 0,  # 1 no gathers in the loop, 2 no dots, 3 no dequantisation
    ):
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        D_TAIL: gl.constexpr = 0 if ROPE_IN_V else D_ROPE
        l8: gl.constexpr = _fp8_regs(CW, num_warps)
        lr: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D_ROPE // 8), D_ROPE // 8],
                                            [num_warps, 1], [1, 0])  # fmt: skip
        ls: gl.constexpr = gl.BlockedLayout([1, 1], [32 // NSC, NSC], [num_warps, 1], [1, 0])
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
        ix: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_H, 16])
        cdt: gl.constexpr = gl.float16  # q, the staging tile and P^T (the dots' operands)
        sh_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], cdt)
        sh_r: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_ROPE], dtype)
        sh_p: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_H], cdt)
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])

        b = gl.program_id(0)
        sp = gl.program_id(2)
        t_start, n_local, n_lim = _split_tiles(topk, tiles_per_split, BLOCK_N)

        kv_st = gl.allocate_shared_memory(cdt, [BLOCK_N, D_V], sh_kv)
        q_smem = gl.allocate_shared_memory(
            cdt, [BLOCK_H, D_V], gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_V], cdt))
        q_land = _q_landing(kv_st, dtype, BLOCK_H)  # q lands here, fp16 into q_smem below
        idx_smem, q_row = _start(q_ptr, idx_ptr, q_land, b, H, t_start, n_local, n_lim,
                                 stride_qb8, stride_qh8, stride_ib, D_V, BLOCK_H, BLOCK_N,
                                 MAX_T, ld, ix)  # fmt: skip
        if D_TAIL > 0:  # the q tail (the rope columns) beside q, the tail dot's B operand
            sh_qt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_ROPE], dtype)
            qt_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, D_ROPE], sh_qt)
            offs_h_lr = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, lr))
            offs_r_lr = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, lr))
            _cp_load(qt_smem, q_row + offs_h_lr[:, None] * (stride_qh8 * 8) + D_V
                     + offs_r_lr[None, :], mask=(offs_h_lr < H)[:, None])  # fmt: skip
        else:
            qt_smem = q_smem
        cp.commit_group()
        d8_ring = gl.allocate_shared_memory(d8_ptr.dtype.element_ty, [NBUF * NCH, BLOCK_N, CW],
                                            _fp8_ring_layout(CW))  # fmt: skip
        rope_ring = gl.allocate_shared_memory(dtype, [NBUF, BLOCK_N, D_ROPE], sh_r)
        sc_ring = gl.allocate_shared_memory(gl.float32, [NBUF, BLOCK_N, NSC], flat)
        p_smem = gl.allocate_shared_memory(cdt, [BLOCK_N, BLOCK_H], sh_p)
        cp.wait_group(1)  # the indices (q may still be in flight)
        _cta_barrier()

        _fp8_ring_start(q_smem, q_land, d8_ring, rope_ring, sc_ring, idx_smem, d8_ptr, rope_ptr,
                        sc_ptr, t_start, n_local, n_lim, stride_d16, stride_r8, stride_s, D_FP8,
                        CW, NCH, NSC, D_ROPE, BLOCK_N, NBUF, l8, lr, ls, ld)  # fmt: skip

        m_i = gl.full([BLOCK_H], -float("inf"), gl.float32, layout=gl.SliceLayout(0, acc_l))
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(0, acc_l))
        acc = warpgroup_mma_init(gl.zeros([D_V, BLOCK_H], gl.float32, layout=acc_l))
        s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=acc_l)
        offs_n_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_l))
        for j in range(0, n_local):
            buf = j % NBUF
            o_j = _fp8_stage(acc, j, kv_st, d8_ring, rope_ring, sc_ring, idx_smem, d8_ptr,
                             rope_ptr, sc_ptr, t_start, n_local, n_lim, stride_d16, stride_r8,
                             stride_s, D_FP8, CW, NCH, NSC, D_ROPE, ROPE_IN_V, BLOCK_N, NBUF,
                             l8, lr, ls, DROP)  # fmt: skip
            s = _score_t(kv_st, rope_ring.index(buf), q_smem, qt_smem, s_zero, D_TAIL, DROP)
            if D_TAIL > 0:  # the tail dot read the rope slot: refill it only now
                _cta_barrier()
                _fp8_refill(d8_ring, rope_ring, sc_ring, idx_smem, d8_ptr, rope_ptr, sc_ptr, j,
                            t_start, n_local, n_lim, stride_d16, stride_r8, stride_s, D_FP8,
                            CW, NCH, NSC, D_ROPE, BLOCK_N, NBUF, l8, lr, ls, DROP)  # fmt: skip
            valid = ((t_start + j) * BLOCK_N + offs_n_s < n_lim) & (
                idx_smem.index(j).load(gl.SliceLayout(1, acc_l)) >= 0)
            m_i, l_i, acc = _softmax_pv(s, valid, m_i, l_i, o_j, kv_st, p_smem, scale_log2,
                                        cdt, DROP)  # fmt: skip
        _finish(o_ptr + b * stride_ob + sp * stride_os, lse_ptr + b * stride_lb + sp * stride_ls,
                acc, m_i, l_i, H, stride_oh, D_V, BLOCK_H, acc_l)  # fmt: skip


DROPS = ("", "gather", "dots")  # the lab diagnostics of the 16-bit kernel
DROPS_FP8 = ("", "gather", "dots", "dequant")  # ... and of the FP8 kernel


def consts(plan: LaunchPlan, lab: Lab) -> dict:
    """The kernel's compile-time arguments for a launch (its compile cache key)."""
    p, cfg = plan.p, plan.cfg
    if p.fp8:
        kc = gluon_fp8.consts(plan, lab)
        kc.pop("STAGED")  # (the 64-head kernel's store; this one stores O^T directly)
    else:
        kc = dict(D_V=p.d_v, D_TAIL=p.d_tail, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
                  BLOCK_T=max(triton.next_power_of_2(max(p.d_tail, 1)), 16),
                  NBUF=cfg.num_stages, MAX_T=triton.next_power_of_2(plan.tiles_per_split),
                  DROP=GLUON_DROP.get(lab.drop, 0))  # fmt: skip
    return dict(kc, num_warps=4)


def smem_bytes(kc: dict) -> int:
    """Shared memory the kernel asks for (q and its tail, the ring, the staging tile for FP8,
    P^T, the split's indices) plus 4 KB of scratch (the softmax's cross-warp reductions)."""
    bn, bh, nbuf = kc["BLOCK_N"], kc["BLOCK_H"], kc["NBUF"]
    if "D_FP8" in kc:
        ring = bn * (kc["D_FP8"] + 2 * kc["D_ROPE"] + 4 * kc["NSC"])
        tail = 0 if kc["ROPE_IN_V"] else bh * kc["D_ROPE"]
        main = 2 * (bh * kc["D_V"] + tail + bn * kc["D_V"]) + nbuf * ring
    else:
        tail = kc["BLOCK_T"] if kc["D_TAIL"] > 0 else 0
        main = 2 * (bh * (kc["D_V"] + tail) + nbuf * bn * (kc["D_V"] + tail))
    return main + 2 * bn * bh + 4 * kc["MAX_T"] * bn + 4 * 1024


def _geometry_ok(plan: LaunchPlan) -> bool:
    """All heads in one block of 16 or 32 (wgmma N; more heads: the 64-head kernels); 64-token
    tiles (the score dot's M); a ring of >= 2 tiles (16-bit) or >= 1 (FP8); d_v a power of
    two in 128..512; 16-bit q."""
    p, cfg = plan.p, plan.cfg
    return (cfg.block_h in (16, 32) and p.h <= cfg.block_h and cfg.block_n == 64
            and cfg.num_warps == 4 and cfg.num_stages >= (1 if p.fp8 else 2)
            and 128 <= p.d_v <= 512 and p.d_v & (p.d_v - 1) == 0
            and p.q.element_size() == 2)  # fmt: skip


def serves(plan: LaunchPlan, lab: Lab) -> bool:
    """The 16-bit kernel ("gluon_nh"): a 16-bit cache, `_geometry_ok`, 16-byte rows for
    cp.async, then gluon_common.usable (Hopper, shared memory, no earlier compile failure)."""
    p = plan.p
    if p.fp8 or lab.drop not in DROPS or not _geometry_ok(plan):
        return False
    if p.d_tail % 8 or p.kv.element_size() != 2 or not gluon_common.rows_aligned(
        (p.q.stride(0), 8), (p.q.stride(1), 8), (p.kv.stride(0), 8), tensors=(p.q, p.kv)
    ):
        return False
    kc = consts(plan, lab)
    return gluon_common.usable(plan, kc, smem_bytes(kc))


def serves_fp8(plan: LaunchPlan, lab: Lab) -> bool:
    """The FP8 kernel ("gluon_nh_fp8"): an FP8 cache of a layout gluon_fp8.layout_ok reads,
    `_geometry_ok`, then gluon_common.usable."""
    p = plan.p
    if not p.fp8 or lab.drop not in DROPS_FP8 or not _geometry_ok(plan):
        return False
    if not gluon_fp8.layout_ok(p.q, p.kv, p.d_v):
        return False
    kc = consts(plan, lab)
    return gluon_common.usable(plan, kc, smem_bytes(kc))


def launch(plan: LaunchPlan, lab: Lab):
    """Launch the 16-bit kernel; the compiled kernel; raises gluon_common.CompileFailed (after a
    one-time warning) if it does not compile here."""
    p = plan.p
    kc = consts(plan, lab)
    so, sl = plan.so, plan.sl
    try:
        return _sparse_mla_split_nh_kernel[plan.grid](
            p.q, p.kv, p.indices, plan.o_dst, plan.lse_dst, p.h, p.topk, plan.tiles_per_split,
            p.q.stride(0) // 8, p.q.stride(1) // 8, p.kv.stride(0) // 8, p.indices.stride(0),
            so[0], so[1], so[2], sl[0], sl[1], plan.scale_log2, **kc,
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - any compile failure: recorded, dispatch decides
        raise gluon_common.compile_failed(e, kc, p.q, "few-heads Gluon split kernel") from e


def launch_fp8(plan: LaunchPlan, lab: Lab):
    """Launch the FP8 kernel; the compiled kernel; raises gluon_common.CompileFailed (after a
    one-time warning) if it does not compile here."""
    p, kv = plan.p, plan.p.kv
    kc = consts(plan, lab)
    so, sl = plan.so, plan.sl
    try:
        return _sparse_mla_split_nh_fp8_kernel[plan.grid](
            p.q, kv.data, kv.rope, kv.scale, p.indices, plan.o_dst, plan.lse_dst, p.h, p.topk,
            plan.tiles_per_split, p.q.stride(0) // 8, p.q.stride(1) // 8, kv.data.stride(0) // 16,
            kv.rope.stride(0) // 8, kv.scale.stride(0), p.indices.stride(0),
            so[0], so[1], so[2], sl[0], sl[1], plan.scale_log2, **kc,
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - any compile failure: recorded, dispatch decides
        raise gluon_common.compile_failed(e, kc, p.q, "few-heads FP8 Gluon split kernel") from e
