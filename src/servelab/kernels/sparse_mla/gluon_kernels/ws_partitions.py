"""The three partitions of the warp-specialised Gluon kernel (ws.py) and their helpers.

The loader gathers tiles into the K ring, the scorer runs the score dot, the online softmax
and the first half of P V, the second half runs P V for the other half of d_v; ws.py's kernel
allocates the shared buffers and barriers and starts the three with gl.warp_specialize.
Hopper only (defined where Gluon is available).
"""

from __future__ import annotations

from .common import AVAILABLE

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

    from .common import (
        _cp_load,
        _cta_barrier,
        _load_q,
        _store_lse,
        _store_out,
        _store_staged,
    )
    from .ws_trace import (
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
