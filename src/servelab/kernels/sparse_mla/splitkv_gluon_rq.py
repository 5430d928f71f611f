"""Split-KV sparse MLA decode with q in registers and a 3-deep K ring (Gluon, Hopper, 16-bit KV).

The warp-specialised kernel (splitkv_gluon_ws.py) keeps q in shared memory (64 KB at 64 heads
x 512 columns) beside two 64 KB K buffers: the consumers hold one, so one tile's gather is in
flight per SM, and its gathers alone run at ~2.2 TB/s (docs/performance.md). Here q's first
Q_REG columns stay in the scorer's registers as the score dot's A operand (wgmma reads A from
registers), the rest (if any) in a small shared tile, which frees room for a third K buffer:
two tiles are in flight while one computes. Three partitions of 4 warps:

- **scorer** (default partition): gathers (cp.async, each tile one commit group, the next
  tiles' indices loaded a tile ahead), S = q K^T, the online softmax, P and the per-row
  rescale factor to shared memory; it holds no output accumulator;
- **two P V partitions**: O[:, half] = O[:, half] * alpha + P V[:, half], P from shared
  memory; each releases the K buffer and P after its dot.

So the score dot of tile j + 1 runs while both halves' P V of tile j do, and the scorer's
chain per tile is the score dot and the softmax only. Same grid, partials and merge as the
other split kernels. V3.2's 576-wide rows do not fit three 72 KB buffers: V4 widths only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton

from . import splitkv_gluon
from .splitkv_gluon import AVAILABLE, LOG2E

if TYPE_CHECKING:
    from .splitkv_config import SplitConfig

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

    from .splitkv_gluon import _cp_load, _cta_barrier, _split_tiles, _store_lse, _store_out

    @gluon.jit
    def _rq_rid(idx_row, t, n_lim, BLOCK_N: gl.constexpr, layout: gl.constexpr):
        """Tile t's indices in `layout` (-1 past the split, like padding)."""
        pos = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=layout)
        return gl.load(idx_row + pos, mask=pos < n_lim, other=-1)

    @gluon.jit
    def _rq_issue(kbuf, idx_ring, kv_ptr, rid, slot, stride_kvt8, D_V: gl.constexpr,
                  ld: gl.constexpr, DROP: gl.constexpr):  # fmt: skip
        """Indices `rid` -> idx_ring[slot] (the softmax's mask) and their rows -> kbuf[slot]
        by cp.async as one commit group (padding rows zero-filled, no memory traffic)."""
        idx_ring.index(slot).store(rid)
        ok = (rid >= 0) & (DROP != 1)  # (DROP 1: no gathers, timing only)
        rows = gl.where(ok, rid, 0).to(gl.int64) * (stride_kvt8 * 8)
        offs_d = gl.arange(0, D_V, layout=gl.SliceLayout(0, ld))
        _cp_load(kbuf.index(slot), kv_ptr + rows[:, None] + offs_d[None, :], mask=ok[:, None])
        cp.commit_group()

    @gluon.jit
    def _rq_scorer(q_hi, kbuf, idx_ring, p_smem, a_smem, l_smem, k_free, p_ready, p_free, done,
                   q_ptr, kv_ptr, idx_row, stride_qb8, stride_qh8, stride_kvt8, lse_ptr, b, hb,
                   sp, H, t_start, n_local, n_lim, stride_lb, stride_ls, scale_log2,
                   D_V: gl.constexpr, Q_REG: gl.constexpr, QA: gl.constexpr,
                   BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, NK: gl.constexpr, NP: gl.constexpr,
                   DROP: gl.constexpr):  # fmt: skip
        """Default partition: gathers, scores, softmax; P and alpha for the P V partitions."""
        dtype: gl.constexpr = kbuf.dtype
        nw: gl.constexpr = gl.num_warps()
        s_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[nw, 1], instr_shape=[16, BLOCK_N, 16])
        q_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_l, k_width=2)
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [nw, 1], [1, 0])
        rl: gl.constexpr = gl.SliceLayout(1, ld)
        # The first NK - 1 tiles' gathers, then q's register part (in flight together).
        for t in gl.static_range(NK - 1):
            _rq_issue(kbuf, idx_ring, kv_ptr, _rq_rid(idx_row, t_start + t, n_lim, BLOCK_N, rl),
                      t, stride_kvt8, D_V, ld, DROP)  # fmt: skip
        rid_n = _rq_rid(idx_row, t_start + NK - 1, n_lim, BLOCK_N, rl)
        # q's register part: columns [0, QA) and [QA, QA + QB) (tensor shapes are powers of 2).
        QB: gl.constexpr = Q_REG - QA if Q_REG > QA else 16  # (a placeholder when none)
        offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, q_l))
        q_rows = q_ptr + b * (stride_qb8 * 8) + offs_h[:, None] * (stride_qh8 * 8)
        q_a = gl.load(q_rows + gl.arange(0, QA, layout=gl.SliceLayout(0, q_l))[None, :],
                      mask=(offs_h < H)[:, None], other=0.0)  # fmt: skip
        q_b = gl.load(q_rows + QA + gl.arange(0, QB, layout=gl.SliceLayout(0, q_l))[None, :],
                      mask=(offs_h < H)[:, None] & (Q_REG > QA), other=0.0)  # fmt: skip
        m_i = gl.full([BLOCK_H], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_l))
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_l))
        s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_l)
        for j in range(0, n_local):
            slot = j % NK
            cp.wait_group(NK - 2)  # tile j (and q's shared part) landed: this thread's copies,
            fence_async_shared()  # ... visible to wgmma,
            _cta_barrier()  # ... everyone's (and the indices written beside them)
            kj = kbuf.index(slot)
            if DROP != 2:
                s = warpgroup_mma(q_a, kj.slice(0, QA, dim=1).permute((1, 0)), s_zero,
                                  use_acc=False, is_async=True)  # fmt: skip
                if Q_REG > QA:
                    s = warpgroup_mma(q_b, kj.slice(QA, QB, dim=1).permute((1, 0)), s,
                                      is_async=True)  # fmt: skip
                if Q_REG < D_V:
                    s = warpgroup_mma(q_hi, kj.slice(Q_REG, D_V - Q_REG, dim=1).permute((1, 0)),
                                      s, is_async=True)  # fmt: skip
            # While the score dot runs: tile j + NK - 1 into the buffer tile j - 1 used, once
            # both P V partitions released it.
            nslot = (j + NK - 1) % NK
            mbarrier.wait(k_free.index(nslot), ((j - 1) // NK) & 1, pred=j >= 1)
            _rq_issue(kbuf, idx_ring, kv_ptr, rid_n, nslot, stride_kvt8, D_V, ld, DROP)
            rid_n = _rq_rid(idx_row, t_start + j + NK, n_lim, BLOCK_N, rl)
            if DROP == 2:  # (no dots, timing only)
                s = s_zero
            else:
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            valid = idx_ring.index(slot).load(gl.SliceLayout(0, s_l)) >= 0  # (-1 past the split)
            s = gl.where(valid[None, :], s * scale_log2, -float("inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_safe = gl.where(m_new == -float("inf"), 0.0, m_new)  # all padding so far
            alpha = gl.exp2(m_i - m_safe)
            p = gl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            pb = j % NP  # P buffer pb, once both P V partitions are done with tile j - NP's
            mbarrier.wait(p_free.index(pb), (j // NP + 1) & 1, pred=j >= NP)
            p_smem.index(pb).store(p.to(dtype))
            a_smem.index(pb).store(alpha)
            fence_async_shared()
            _cta_barrier()
            mbarrier.arrive(p_ready.index(pb))
        cp.wait_group(0)  # the trailing (masked) gathers
        l_smem.store(l_i)
        _cta_barrier()
        mbarrier.arrive(done)
        _store_lse(lse_ptr + b * stride_lb + sp * stride_ls, m_i, l_i, hb, H, BLOCK_H,
                   gl.SliceLayout(1, s_l))  # fmt: skip

    @gluon.jit
    def _rq_pv(kbuf, p_smem, a_smem, l_smem, k_free, p_ready, p_free, done, o_ptr, b, hb, sp, H,
               n_local, stride_ob, stride_os, stride_oh, COL0: gl.constexpr, D_V: gl.constexpr,
               BLOCK_H: gl.constexpr, NK: gl.constexpr, NP: gl.constexpr,
               DROP: gl.constexpr):  # fmt: skip
        """Worker: O[:, COL0:COL0 + D_V/2] over the tiles, P from shared memory."""
        nw: gl.constexpr = gl.num_warps()
        o_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[nw, 1], instr_shape=[16, D_V // 2, 16])
        acc = gl.zeros([BLOCK_H, D_V // 2], gl.float32, layout=o_l)
        for j in range(0, n_local):
            pb = j % NP
            mbarrier.wait(p_ready.index(pb), (j // NP) & 1)
            acc = acc * a_smem.index(pb).load(gl.SliceLayout(1, o_l))[:, None]
            if DROP != 2:
                acc = warpgroup_mma(p_smem.index(pb), kbuf.index(j % NK).slice(COL0, D_V // 2, dim=1),
                                    acc, is_async=True)  # fmt: skip
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _cta_barrier()
            mbarrier.arrive(p_free.index(pb))
            mbarrier.arrive(k_free.index(j % NK))
        mbarrier.wait(done, 0)
        _store_out(o_ptr + b * stride_ob + sp * stride_os, acc,
                   l_smem.load(gl.SliceLayout(1, o_l)), hb, H, stride_oh, COL0, D_V // 2,
                   BLOCK_H, o_l)  # fmt: skip

    @gluon.jit
    def _sparse_mla_split_gluon_rq_kernel(
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
        Q_REG: gl.constexpr,  # q columns held in registers; the rest in shared memory
        QA: gl.constexpr,  # the first register part's columns (Q_REG - QA: the second part's)
        BLOCK_H: gl.constexpr,  # 64: one wgmma M
        BLOCK_N: gl.constexpr,
        NK: gl.constexpr,  # K buffers (NK - 1 tiles in flight beside the computing one)
        NP: gl.constexpr,  # P buffers
        DROP: gl.constexpr,  # diagnostics (wrong results): 1 no gathers, 2 no dots
        PV_REGS: gl.constexpr,  # registers per thread of each P V partition
        num_warps: gl.constexpr,  # 4: the scorer; the workers bring 4 each
    ):
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        D_QS: gl.constexpr = D_V - Q_REG if Q_REG < D_V else 64  # (a placeholder when none)
        sh_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], dtype)
        sh_q: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_QS], dtype)
        sh_p: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], dtype)
        flat1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])

        b = gl.program_id(0)
        hb = gl.program_id(1)
        sp = gl.program_id(2)
        t_start, n_local, n_lim = _split_tiles(topk, tiles_per_split, BLOCK_N)

        # q's shared part by cp.async (the scorer's oldest commit group).
        q_hi = gl.allocate_shared_memory(dtype, [BLOCK_H, D_QS], sh_q)
        if Q_REG < D_V:
            ldq: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // D_QS, D_QS // 8],
                                                 [num_warps, 1], [1, 0])  # fmt: skip
            offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ldq))
            offs_c = Q_REG + gl.arange(0, D_QS, layout=gl.SliceLayout(0, ldq))
            _cp_load(q_hi, q_ptr + b * (stride_qb8 * 8) + offs_h[:, None] * (stride_qh8 * 8)
                     + offs_c[None, :], mask=(offs_h < H)[:, None])  # fmt: skip
            cp.commit_group()
        kbuf = gl.allocate_shared_memory(dtype, [NK, BLOCK_N, D_V], sh_kv)
        idx_ring = gl.allocate_shared_memory(gl.int32, [NK, BLOCK_N], flat1)
        p_smem = gl.allocate_shared_memory(dtype, [NP, BLOCK_H, BLOCK_N], sh_p)
        a_smem = gl.allocate_shared_memory(gl.float32, [NP, BLOCK_H], flat1)
        l_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], flat1)
        k_free = gl.allocate_shared_memory(gl.int64, [NK, 1], mbarrier.MBarrierLayout())
        p_ready = gl.allocate_shared_memory(gl.int64, [NP, 1], mbarrier.MBarrierLayout())
        p_free = gl.allocate_shared_memory(gl.int64, [NP, 1], mbarrier.MBarrierLayout())
        done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NK):
            mbarrier.init(k_free.index(i), count=2)  # the two P V partitions
        for i in gl.static_range(NP):
            mbarrier.init(p_ready.index(i), count=1)  # the scorer
            mbarrier.init(p_free.index(i), count=2)
        mbarrier.init(done, count=1)
        fence_async_shared()  # the barriers' initialisation, before any partition uses them
        _cta_barrier()

        o_row = o_ptr
        gl.warp_specialize([
            (_rq_scorer, (q_hi, kbuf, idx_ring, p_smem, a_smem, l_smem, k_free, p_ready, p_free,
                          done, q_ptr, kv_ptr, idx_ptr + b * stride_ib, stride_qb8, stride_qh8,
                          stride_kvt8, lse_ptr, b, hb, sp, H, t_start, n_local, n_lim, stride_lb,
                          stride_ls, scale_log2, D_V, Q_REG, QA, BLOCK_H, BLOCK_N, NK, NP, DROP)),
            (_rq_pv, (kbuf, p_smem, a_smem, l_smem, k_free, p_ready, p_free, done, o_row, b, hb,
                      sp, H, n_local, stride_ob, stride_os, stride_oh, 0, D_V, BLOCK_H, NK, NP,
                      DROP)),
            (_rq_pv, (kbuf, p_smem, a_smem, l_smem, k_free, p_ready, p_free, done, o_row, b, hb,
                      sp, H, n_local, stride_ob, stride_os, stride_oh, D_V // 2, D_V, BLOCK_H, NK,
                      NP, DROP)),
        ], [4, 4], [PV_REGS, PV_REGS])  # fmt: skip


DROPS = ("", "gather", "dots")  # the diagnostics this kernel implements
Q_REG = 384  # q columns in the scorer's registers (96 per thread); 128 in shared memory


def consts(cfg: SplitConfig, d_v: int, drop: str = "", q_reg: int = Q_REG, np_: int = 2,
           pv_regs: int = 160) -> dict:  # fmt: skip
    """The kernel's compile-time arguments for a launch (its compile cache key). Registers per
    thread (setmaxnreg; 512 per lane across the three 4-warp partitions): each P V partition
    holds a 64 x 256 fp32 accumulator (128) plus addresses -> pv_regs (ptxas, Triton 3.6:
    spills at 152, none at 160); the scorer gets the rest, 512 - 2 x 160 - 8 = 184 (q's 96
    register columns' worth, the score tile, the gathers' addresses; no spills). All 512 of
    q's columns in registers spill ~300 bytes, hence Q_REG = 384."""
    q_reg = min(q_reg, d_v)
    qa = triton.next_power_of_2(q_reg) // (1 if q_reg & (q_reg - 1) == 0 else 2)
    return dict(D_V=d_v, Q_REG=q_reg, QA=qa, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
                NK=cfg.num_stages, NP=np_, DROP=splitkv_gluon.DROPS[drop], PV_REGS=pv_regs,
                num_warps=4)  # fmt: skip


def smem_bytes(kc: dict) -> int:
    """Shared memory the kernel asks for: q's shared part, the K ring and its indices, P and
    the per-row factors, plus 512 B for the barriers and alignment (the compiler asked
    231,168 B at V4's widths, Triton 3.6; 227 KB is 232,448)."""
    d_qs = kc["D_V"] - kc["Q_REG"] if kc["Q_REG"] < kc["D_V"] else 64
    return (2 * (kc["BLOCK_H"] * d_qs + kc["NK"] * kc["BLOCK_N"] * kc["D_V"]
                 + kc["NP"] * kc["BLOCK_H"] * kc["BLOCK_N"])
            + 4 * (kc["NK"] * kc["BLOCK_N"] + (kc["NP"] + 1) * kc["BLOCK_H"]) + 512)  # fmt: skip


def serves(cfg: SplitConfig, q: torch.Tensor, kv: torch.Tensor, d_v: int,
           tiles_per_split: int, drop: str = "") -> bool:  # fmt: skip
    """Whether this kernel can run the launch: Hopper with Gluon, 64-head and 64-token tiles,
    no score-only tail (V4 widths: D_qk == d_v), d_v a power of two in [256, 512] (q's shared
    part one swizzle atom wide or more), 16-byte rows, the shared-memory budget, and no
    earlier compile failure of this key."""
    if drop not in DROPS or kv.shape[1] != d_v:
        return False
    if not (splitkv_gluon.gluon_device(q.device) and cfg.block_h == 64 and cfg.block_n == 64
            and cfg.num_stages >= 3 and 256 <= d_v <= 512 and d_v & (d_v - 1) == 0
            and kv.element_size() == 2 and q.element_size() == 2):  # fmt: skip
        return False
    if any(x % 8 for x in (q.stride(0), q.stride(1), kv.stride(0))) or any(
        t.data_ptr() % 16 for t in (q, kv)
    ):
        return False
    kc = consts(cfg, d_v, drop)
    return smem_bytes(kc) <= splitkv_gluon.SMEM_LIMIT and splitkv_gluon.key(kc, q) not in (
        splitkv_gluon.FAILED
    )


def launch(cfg, grid, q, kv, indices, o_dst, lse_dst, h, topk, tiles_per_split, so, sl,
           sm_scale, d_v, drop):  # fmt: skip
    """Launch the kernel; the compiled kernel, or None (and a one-time warning) if it does not
    compile here (the caller then runs a Triton kernel)."""
    kc = consts(cfg, d_v, drop)
    try:
        return _sparse_mla_split_gluon_rq_kernel[grid](
            q, kv, indices, o_dst, lse_dst, h, topk, tiles_per_split,
            q.stride(0) // 8, q.stride(1) // 8, kv.stride(0) // 8, indices.stride(0),
            so[0], so[1], so[2], sl[0], sl[1], sm_scale * LOG2E, **kc,
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - any compile failure: a Triton kernel serves instead
        return splitkv_gluon.compile_failed(e, kc, q, "register-q Gluon split kernel")
