"""Split-KV sparse MLA decode written in Gluon (Triton's explicit-layout dialect), Hopper only.

Same grid, online softmax, partials and merge as splitkv.py (16-bit KV, 64-head tiles, 8
warps). What Triton's automatic passes did not give the tl kernel, written out here:

- **Gathers ahead of the dots.** A ring of NBUF shared-memory tiles filled by cp.async: the
  gather of tile j + NBUF - 1 is issued at the top of iteration j, before tile j's dots, so
  NBUF - 1 gathers are in flight while a tile computes. (Triton 3.6's pipeliner issued the
  next gather after both dots and waited for it at the top of the next tile.)
- **Indices once.** The split's whole index range is loaded up front into shared memory
  (at most a few KB), so no gather waits on a dependent index load inside the loop.
- **No duplicated score dot.** With a chained dot (S feeds P V) Triton lays 8 warps along M
  (`warpsPerCTA [8, 1]`); with 64 heads on M that makes both warpgroups compute the same
  64 x BLOCK_N scores. Here S uses `[4, 2]` (each warpgroup half the tokens) and the row
  max / sum cross the two warpgroups through shared memory.

The P V dot keeps d_v split over the two warpgroups (64 x 256 fp32 accumulator each).
Gluon does not run in Triton's CPU interpreter: tests run it on the GPU; on the CPU they
compile it for sm_90a and check the compiler's resource report.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import TYPE_CHECKING

import torch
import triton

if TYPE_CHECKING:
    from .splitkv_config import SplitConfig

LOG2E = 1.4426950408889634

try:  # Gluon is experimental; a Triton without it (or with another API) disables this path
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_init,
        warpgroup_mma_wait,
    )

    # cp.async into shared memory: `async_copy_global_to_shared` in Triton 3.6 (the H200
    # machine), renamed `async_load` later (same arguments).
    _cp_load = getattr(cp, "async_load", None) or cp.async_copy_global_to_shared
    # CTA barrier: `thread_barrier` in 3.6, `barrier` later.
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    AVAILABLE = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    AVAILABLE = False

if AVAILABLE:

    @gluon.jit
    def _program_ids(HB_FAST: gl.constexpr):
        """(request, head block, head blocks) of this program: grid (B, head blocks, splits),
        or with HB_FAST (head blocks, B, splits) (`grid_order`)."""
        if HB_FAST:
            b = gl.program_id(1)
            hb = gl.program_id(0)
            n_hb = gl.num_programs(0)
        else:
            b = gl.program_id(0)
            hb = gl.program_id(1)
            n_hb = gl.num_programs(1)
        return b, hb, n_hb

    @gluon.jit
    def _split_tiles(topk, tiles_per_split, BLOCK_N: gl.constexpr):
        """This program's split (grid axis 2): its first tile, its tile count (<= 0 for a
        split past the last tile) and the token limit."""
        n_tiles = gl.cdiv(topk, BLOCK_N)
        t_start = gl.program_id(2) * tiles_per_split
        n_local = gl.minimum(t_start + tiles_per_split, n_tiles) - t_start
        return t_start, n_local, gl.minimum(topk, (t_start + n_local) * BLOCK_N)

    @gluon.jit
    def _load_split_indices(idx_smem, idx_row, t_start, n_local, n_lim, BLOCK_N: gl.constexpr,
                            layout: gl.constexpr):  # fmt: skip
        """The split's indices into shared memory ([tile, slot]) by cp.async, one row per
        tile (a 1-D view per row keeps the layouts simple); no commit."""
        offs = gl.arange(0, BLOCK_N, layout=layout)
        for t in range(0, n_local):
            slot = (t_start + t) * BLOCK_N + offs
            _cp_load(idx_smem.index(t), idx_row + slot, mask=slot < n_lim)

    @gluon.jit
    def _load_q(q_smem, q_row, hb, H, stride_qh8, D_V: gl.constexpr, BLOCK_H: gl.constexpr,
                layout: gl.constexpr):  # fmt: skip
        """This head block's q rows (the first D_V columns) into shared memory by cp.async
        (heads >= H zero-filled); no commit."""
        offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, layout))
        offs_d = gl.arange(0, D_V, layout=gl.SliceLayout(0, layout))
        _cp_load(q_smem, q_row + offs_h[:, None] * (stride_qh8 * 8) + offs_d[None, :],
                 mask=(offs_h < H)[:, None])  # fmt: skip

    @gluon.jit
    def _store_out(o_row, acc, l_o, hb, H, stride_oh, COL0: gl.constexpr, D: gl.constexpr,
                   BLOCK_H: gl.constexpr, layout: gl.constexpr):  # fmt: skip
        """acc / l (rows with nothing stay 0) -> columns [COL0, COL0 + D) of this head block's
        output rows (heads < H)."""
        o = acc / gl.where(l_o > 0.0, l_o, 1.0)[:, None]
        offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, layout))
        offs_d = COL0 + gl.arange(0, D, layout=gl.SliceLayout(0, layout))
        gl.store(o_row + offs_h[:, None] * stride_oh + offs_d[None, :],
                 o.to(o_row.dtype.element_ty), mask=(offs_h < H)[:, None])  # fmt: skip

    # A shared-memory view as another dtype and shape: `_reinterpret` in Triton 3.6 (the H200
    # machine), `reinterpret` later.
    if hasattr(gl.shared_memory_descriptor, "reinterpret"):

        @gluon.jit
        def _view_as(buf, dtype: gl.constexpr, R: gl.constexpr, C: gl.constexpr,
                     layout: gl.constexpr):  # fmt: skip
            """`buf`'s bytes as an [R, C] `dtype` tile in `layout`."""
            return buf.reinterpret(dtype, [R, C], layout)

    else:

        @gluon.jit
        def _view_as(buf, dtype: gl.constexpr, R: gl.constexpr, C: gl.constexpr,
                     layout: gl.constexpr):  # fmt: skip
            """`buf`'s bytes as an [R, C] `dtype` tile in `layout`."""
            return buf._reinterpret(dtype, [R, C], layout)

    @gluon.jit
    def _store_staged(o_row, o, buf, hb, H, stride_oh, COL0: gl.constexpr, D: gl.constexpr,
                      BLOCK_H: gl.constexpr):  # fmt: skip
        """o [BLOCK_H, D] (any layout) -> columns [COL0, COL0 + D) of this head block's output
        rows (heads < H), through the free shared buffer `buf` (>= BLOCK_H x D elements of o's
        dtype, its bytes reinterpreted, 16-byte chunks swizzled by row): each thread then
        stores 16 contiguous bytes and each warp whole row segments. From a wgmma
        accumulator's layout each thread stores 2 elements in each of eight rows at once: for
        16-bit O half a 32-byte sector per row. The caller's threads must be done with `buf`
        (and call this from all of them: a barrier separates the write from the read)."""
        odt: gl.constexpr = o.dtype
        vec: gl.constexpr = 128 // odt.primitive_bitwidth  # 16 bytes
        tpw_c: gl.constexpr = min(32, D // vec)
        st: gl.constexpr = gl.BlockedLayout([1, vec], [32 // tpw_c, tpw_c], [gl.num_warps(), 1],
                                            [1, 0])  # fmt: skip
        stage = _view_as(buf, odt, BLOCK_H, D, gl.SwizzledSharedLayout(vec, 1, 8, [1, 0]))
        stage.store(o)
        _cta_barrier()  # every thread's rows written before any thread reads others'
        v = stage.load(st)
        offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, st))
        offs_d = COL0 + gl.arange(0, D, layout=gl.SliceLayout(0, st))
        gl.store(o_row + offs_h[:, None] * stride_oh + offs_d[None, :], v,
                 mask=(offs_h < H)[:, None])  # fmt: skip

    @gluon.jit
    def _store_lse(lse_row, m_i, l_i, hb, H, BLOCK_H: gl.constexpr, layout: gl.constexpr):
        """Natural-log lse = (m + log2 l) ln 2 of this head block (-inf when l == 0)."""
        offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=layout)
        gl.store(lse_row + offs_h, (m_i + gl.log2(l_i)) * 0.6931471805599453, mask=offs_h < H)

    @gluon.jit
    def _issue_gather(kv_smem, kt_smem, idx_smem, kv_ptr, jn, t_start, n_local, n_lim,
                      stride_kvt8, offs_n_ld, offs_d_ld, offs_n_lt, offs_t_lt,
                      D_V: gl.constexpr, D_TAIL: gl.constexpr, BLOCK_N: gl.constexpr,
                      NBUF: gl.constexpr, ld: gl.constexpr, ld_t: gl.constexpr,
                      SKIP: gl.constexpr = False):  # fmt: skip
        """cp.async of tile jn's rows into ring slot jn % NBUF, as one commit group. Tiles
        past the split read a copied index row (row n_local - 1) and are masked off by
        position (no memory traffic; the slot is zero-filled), so the ring always advances
        by one group per tile. SKIP (the no-gathers diagnostic): an empty group."""
        if SKIP:
            cp.commit_group()
            return
        row = idx_smem.index(gl.maximum(gl.minimum(jn, n_local - 1), 0))
        rid = row.load(gl.SliceLayout(1, ld))
        ok = ((t_start + jn) * BLOCK_N + offs_n_ld < n_lim) & (rid >= 0)
        rows = gl.where(ok, rid, 0).to(gl.int64) * (stride_kvt8 * 8)
        _cp_load(kv_smem.index(jn % NBUF), kv_ptr + rows[:, None] + offs_d_ld[None, :],
                 mask=ok[:, None])  # fmt: skip
        if D_TAIL > 0:
            rid_t = row.load(gl.SliceLayout(1, ld_t))
            ok_t = ((t_start + jn) * BLOCK_N + offs_n_lt < n_lim) & (rid_t >= 0)
            rows_t = gl.where(ok_t, rid_t, 0).to(gl.int64) * (stride_kvt8 * 8)
            _cp_load(kt_smem.index(jn % NBUF),
                     kv_ptr + rows_t[:, None] + D_V + offs_t_lt[None, :],
                     mask=ok_t[:, None] & (offs_t_lt < D_TAIL)[None, :])  # fmt: skip
        cp.commit_group()

    @gluon.jit
    def _score(q_smem, qt_op, kv_j, kt_j, s_zero, D_TAIL: gl.constexpr, DROP: gl.constexpr):
        """S = q K^T (+ the score-only tail) for one tile (DROP == 2: zeros, no dot)."""
        if DROP == 2:
            return s_zero
        s_tok = warpgroup_mma(q_smem, kv_j.permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)  # fmt: skip
        if D_TAIL > 0:
            s_tok = warpgroup_mma(qt_op, kt_j.permute((1, 0)), s_tok, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))

    @gluon.jit
    def _sparse_mla_split_gluon_kernel(
        q_ptr,  # [B, H, D_qk]
        kv_ptr,  # [T, D_qk]
        idx_ptr,  # [B, topk] int32
        o_ptr,  # final [B, H, d_v] or partial [B, S, H, d_v]
        lse_ptr,  # final [B, H] or partial [B, S, H] fp32
        H,
        topk,
        tiles_per_split,
        stride_qb8,  # q's and KV's strides / 8: rows start 16-byte aligned, so that
        stride_qh8,  # cp.async moves 16 B (the launcher checks they divide)
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
        NBUF: gl.constexpr,  # ring depth: NBUF - 1 gathers in flight
        MAX_T: gl.constexpr,  # power of two >= tiles per split
        num_warps: gl.constexpr,
        DROP: gl.constexpr = 0,  # diagnostics (wrong results): 1 no gathers in the loop, 2 no dots
    ):
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        # Register layouts. Gathers: 16-byte vectors, a warp per row slice.
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
        ld_t: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        ix: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])  # [t, n]
        # Scores: the two warpgroups split the tokens (no duplicated dot).
        s_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_N // 2, 16])
        # Output: the two warpgroups split d_v.
        o_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, D_V // 2, 16])
        p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
        sh_kv: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], dtype)
        sh_q: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, D_V], dtype)
        sh_ix: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # per index tile

        b = gl.program_id(0)
        hb = gl.program_id(1)
        sp = gl.program_id(2)
        t_start, n_local, n_lim = _split_tiles(topk, tiles_per_split, BLOCK_N)

        # This split's indices, once, into shared memory.
        idx_smem = gl.allocate_shared_memory(gl.int32, [MAX_T, BLOCK_N], sh_ix)
        _load_split_indices(idx_smem, idx_ptr + b * stride_ib, t_start, n_local, n_lim, BLOCK_N,
                            gl.SliceLayout(0, ix))  # fmt: skip
        cp.commit_group()
        # q (and its score-only tail) by cp.async too, in flight with the first gathers.
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_H, D_V], sh_q)
        q_row = q_ptr + b * (stride_qb8 * 8)
        _load_q(q_smem, q_row, hb, H, stride_qh8, D_V, BLOCK_H, ld)
        offs_d_ld = gl.arange(0, D_V, layout=gl.SliceLayout(0, ld))
        kv_smem = gl.allocate_shared_memory(dtype, [NBUF, BLOCK_N, D_V], sh_kv)
        offs_n_ld = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld))
        offs_n_lt = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_t))
        offs_t_lt = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, ld_t))
        if D_TAIL > 0:
            sh_kt: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_T], dtype)
            offs_h_lt = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld_t))
            # The q tail stays in registers as the score dot's A operand (16 per thread at
            # 64 columns): V3.2's 64-token ring then fits in 227 KB of shared memory.
            qt = gl.load(q_row + offs_h_lt[:, None] * (stride_qh8 * 8) + D_V
                         + offs_t_lt[None, :],
                         mask=(offs_h_lt < H)[:, None] & (offs_t_lt < D_TAIL)[None, :],
                         other=0.0)  # fmt: skip
            qt_op = gl.convert_layout(qt, gl.DotOperandLayout(0, s_l, 2))
            kt_smem = gl.allocate_shared_memory(dtype, [NBUF, BLOCK_N, BLOCK_T], sh_kt)
        else:
            qt_op = gl.zeros([BLOCK_H, BLOCK_T], dtype, layout=ld_t)  # unused
            kt_smem = kv_smem
        cp.commit_group()
        cp.wait_group(1)  # the indices (q may still be in flight)
        _cta_barrier()  # the index rows are read back by other threads

        # Prologue: the gathers of the first NBUF - 1 tiles.
        for j in gl.static_range(NBUF - 1):
            _issue_gather(kv_smem, kt_smem, idx_smem, kv_ptr, j, t_start, n_local, n_lim,
                          stride_kvt8, offs_n_ld, offs_d_ld, offs_n_lt, offs_t_lt,
                          D_V, D_TAIL, BLOCK_N, NBUF, ld, ld_t)  # fmt: skip

        m_i = gl.full([BLOCK_H], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_l))
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_l))
        # Carried as an in-flight wgmma result: a tile's P V dot runs while the loop returns to
        # its top (it must finish before its slot is refilled there).
        acc = warpgroup_mma_init(gl.zeros([BLOCK_H, D_V], gl.float32, layout=o_l))
        s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_l)
        offs_n_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_l))
        for j in range(0, n_local):
            # The previous tile's P V dot read the slot refilled below: let it finish...
            o_j = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _cta_barrier()  # ...in both warpgroups, before any warp refills it
            _issue_gather(kv_smem, kt_smem, idx_smem, kv_ptr, j + NBUF - 1, t_start, n_local,
                          n_lim, stride_kvt8, offs_n_ld, offs_d_ld, offs_n_lt, offs_t_lt, D_V,
                          D_TAIL, BLOCK_N, NBUF, ld, ld_t, DROP == 1)  # fmt: skip
            cp.wait_group(NBUF - 1)  # tile j landed (this thread's copies),
            _cta_barrier()  # ...everyone's,
            fence_async_shared()  # ...visible to wgmma
            buf = j % NBUF
            kv_j = kv_smem.index(buf)
            s = _score(q_smem, qt_op, kv_j, kt_smem.index(buf), s_zero, D_TAIL, DROP)
            valid = ((t_start + j) * BLOCK_N + offs_n_s < n_lim) & (
                idx_smem.index(j).load(gl.SliceLayout(0, s_l)) >= 0)
            s = gl.where(valid[None, :], s * scale_log2, -float("inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_safe = gl.where(m_new == -float("inf"), 0.0, m_new)  # all padding so far
            alpha = gl.exp2(m_i - m_safe)
            p = gl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            o_j = o_j * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
            p_op = gl.convert_layout(p.to(dtype), p_l)
            if DROP == 2:
                acc = warpgroup_mma_init(o_j)  # (P's layout conversion is dropped too)
            else:
                acc = warpgroup_mma(p_op, kv_j, o_j, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        cp.wait_group(0)

        _store_out(o_ptr + b * stride_ob + sp * stride_os, acc,
                   gl.convert_layout(l_i, gl.SliceLayout(1, o_l)), hb, H, stride_oh, 0, D_V,
                   BLOCK_H, o_l)  # fmt: skip
        _store_lse(lse_ptr + b * stride_lb + sp * stride_ls, m_i, l_i, hb, H, BLOCK_H,
                   gl.SliceLayout(1, s_l))  # fmt: skip


def gluon_device(device: torch.device | None = None) -> bool:
    """Whether the Gluon kernel can run here: a Triton with Gluon and a Hopper GPU, and not
    switched off with SERVELAB_SPARSE_MLA_GLUON=0 (to A/B it against the Triton kernels, e.g.
    inside the embedded engine, whose splitkv backend takes the default config)."""
    if os.environ.get("SERVELAB_SPARSE_MLA_GLUON", "1") == "0":
        return False
    if not AVAILABLE or not torch.cuda.is_available():
        return False
    if device is not None and device.type != "cuda":
        return False
    index = torch.cuda.current_device() if device is None or device.index is None else device.index
    return _is_hopper(index)


@functools.cache
def _is_hopper(index: int) -> bool:  # asked on every default launch: once per device
    return torch.cuda.get_device_capability(index)[0] == 9


# Gluon launches whose compile failed in this process (an experimental dialect: another Triton
# may reject the code): key -> error; those launches run the tl kernel instead.
FAILED: dict[tuple, str] = {}
SMEM_LIMIT = 227 * 1024  # bytes of shared memory per block on Hopper
# Diagnostics of the Gluon kernels (wrong results, timing only) -> their DROP constexpr; each
# kernel serves the ones it implements ("dequant": the FP8 kernel only).
DROPS = {"": 0, "gather": 1, "dots": 2, "dequant": 3}


def consts(cfg: SplitConfig, d_v: int, d_tail: int, tiles_per_split: int, drop: str) -> dict:
    """The Gluon kernel's compile-time arguments for a launch (its compile cache key)."""
    return dict(D_V=d_v, D_TAIL=d_tail, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
                BLOCK_T=max(triton.next_power_of_2(max(d_tail, 1)), 16), NBUF=cfg.num_stages,
                MAX_T=triton.next_power_of_2(tiles_per_split), num_warps=8,
                DROP=DROPS[drop])  # fmt: skip


def num_sms(device: torch.device) -> int:
    """The device's SM count (the split count and the grid order are chosen from it)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8  # interpreter: any small number; only exercises the multi-split path


MAX_GRID_Y = 65535  # CUDA's limit on a grid's second axis


def grid_order(kc: dict, grid: tuple, device: torch.device) -> tuple:
    """The launch grid for a kernel's compile-time arguments `kc` (B, head blocks, splits),
    or where kc["HB_FAST"] asks for it (head blocks, B, splits): a request's head-block
    programs then start one after another and run side by side, so that the second finds the
    rows the first gathers in L2. That pays where the programs outnumber the SMs (128 heads at
    B = 128: 256 programs), since in the first order a request's second head block ran a wave
    later and read its rows from memory again; with one wave it was within noise either way
    (H200, tenth follow-up). So HB_FAST is cleared in kc where there is one head block, where
    the programs fit in one wave (one per SM of `device`), and past MAX_GRID_Y requests."""
    b, n_hb, n_s = grid
    if kc.get("HB_FAST") and (n_hb == 1 or b * n_hb * n_s <= num_sms(device) or b > MAX_GRID_Y):
        kc["HB_FAST"] = False
    return (n_hb, b, n_s) if kc.get("HB_FAST") else grid


def key(kconsts: dict, q: torch.Tensor) -> tuple:
    """The failure cache's key: every compile-time argument and q's dtype."""
    return (*sorted(kconsts.items()), q.dtype)


def serves(cfg: SplitConfig, q: torch.Tensor, kv: torch.Tensor, d_v: int,
           tiles_per_split: int, drop: str = "") -> bool:  # fmt: skip
    """Whether splitkv_gluon.py can run this launch: a Hopper GPU (wgmma) and a Triton with
    Gluon; 64-head tiles over 8 warps (two warpgroups); d_v a power of two <= 512 (each
    warpgroup's half is one wgmma N <= 256); a ring of >= 2 tiles of >= 16 tokens; q and KV
    rows and the score-only tail in 16-byte units (cp.async moves 16 B); q, the ring and the
    split's indices within Hopper's shared memory; no earlier compile failure of this key."""
    d_tail = kv.shape[1] - d_v
    if not (gluon_device(q.device) and cfg.block_h == 64 and cfg.num_warps == 8
            and cfg.block_n >= 16 and cfg.num_stages >= 2 and 32 <= d_v <= 512
            and d_v & (d_v - 1) == 0 and d_tail % 8 == 0 and kv.element_size() == 2
            and q.element_size() == 2 and drop in ("", "gather", "dots")):  # fmt: skip
        return False
    if any(x % 8 for x in (q.stride(0), q.stride(1), kv.stride(0))) or any(
        t.data_ptr() % 16 for t in (q, kv)
    ):
        return False
    kc = consts(cfg, d_v, d_tail, tiles_per_split, drop)
    smem = 2 * (64 * d_v + cfg.num_stages * cfg.block_n * (d_v + d_tail))
    smem += 4 * kc["MAX_T"] * cfg.block_n + 8 * 1024  # indices; reductions, P's conversion
    return smem <= SMEM_LIMIT and key(kc, q) not in FAILED


def launch(cfg, grid, q, kv, indices, o_dst, lse_dst, h, topk, tiles_per_split, so, sl,
           sm_scale, d_v, drop):  # fmt: skip
    """Launch splitkv_gluon.py; the compiled kernel, or None (and a one-time warning) if it
    does not compile here."""
    kc = consts(cfg, d_v, kv.shape[1] - d_v, tiles_per_split, drop)
    try:
        return _sparse_mla_split_gluon_kernel[grid](
            q, kv, indices, o_dst, lse_dst, h, topk, tiles_per_split,
            q.stride(0) // 8, q.stride(1) // 8, kv.stride(0) // 8, indices.stride(0),
            so[0], so[1], so[2], sl[0], sl[1], sm_scale * LOG2E, **kc,
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - any compile failure: the tl kernel serves instead
        return compile_failed(e, kc, q, "Gluon split kernel")


def compile_failed(e: Exception, kc: dict, q: torch.Tensor, name: str) -> None:
    """A Gluon launch that raised: re-raise inside CUDA graph capture (the compile happens on
    the first, uncaptured call; a capture error must not be hidden), else record the key in
    FAILED, warn once and return None (the caller runs a Triton kernel)."""
    if q.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise e
    k = key(kc, q)
    FAILED[k] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    warnings.warn(f"sparse MLA: the {name} did not compile here ({FAILED[k]}); using the "
                  "Triton kernel", stacklevel=4)  # fmt: skip
    return None
