"""What the Gluon split kernels share (Hopper only): device check, device functions, the grid
order, and the compile-failure record.

Gluon is Triton's explicit-layout dialect. The kernels built on these helpers (gluon_kernels/ws.py,
gluon_kernels/fp8.py, gluon_kernels/nh.py) write out what Triton's automatic passes did not give the Triton
kernel: gathers issued ahead of the dots into a shared-memory ring by cp.async, the split's
indices loaded once, and the score dot not duplicated across warpgroups. Gluon does not run in
Triton's CPU interpreter: tests run the kernels on the GPU; on the CPU they compile them for
sm_90a and check the compiler's resource report.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..splitkv.plan import LaunchPlan

try:  # Gluon is experimental; a Triton without it (or with another API) disables this path
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

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


def gluon_device(device: torch.device | None = None) -> bool:
    """Whether the Gluon kernels can run here: a Triton with Gluon and a Hopper GPU, and not
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
# may reject the code): key -> error. Such a launch is not tried again: a default call runs
# the next rule's variant, a call that names the variant raises.
FAILED: dict[tuple, str] = {}
SMEM_LIMIT = 227 * 1024  # bytes of shared memory per block on Hopper
MAX_GRID_Y = 65535  # CUDA's limit on a grid's second axis


def grid_order(kc: dict, grid: tuple, num_sms: int) -> tuple:
    """The launch grid for a kernel's compile-time arguments `kc` (B, head blocks, splits),
    or where kc["HB_FAST"] asks for it (head blocks, B, splits): a request's head-block
    programs then start one after another and run side by side, so that the second finds the
    rows the first gathers in L2. That pays where the programs outnumber the SMs (128 heads at
    B = 128: 256 programs), since in the first order a request's second head block ran a wave
    later and read its rows from memory again; with one wave it was within noise either way
    (H200, tenth follow-up). So HB_FAST is cleared in kc where there is one head block, where
    the programs fit in one wave (one per SM), and past MAX_GRID_Y requests."""
    b, n_hb, n_s = grid
    if kc.get("HB_FAST") and (n_hb == 1 or b * n_hb * n_s <= num_sms or b > MAX_GRID_Y):
        kc["HB_FAST"] = False
    return (n_hb, b, n_s) if kc.get("HB_FAST") else grid


def key(kconsts: dict, q: torch.Tensor) -> tuple:
    """The failure cache's key: every compile-time argument and q's dtype."""
    return (*sorted(kconsts.items()), q.dtype)


class CompileFailed(RuntimeError):
    """A Gluon kernel that did not compile here (recorded in FAILED; dispatch/launch.py decides)."""


def compile_failed(e: Exception, kc: dict, q: torch.Tensor, name: str) -> CompileFailed:
    """A Gluon launch that raised: re-raise inside CUDA graph capture (the compile happens on
    the first, uncaptured call; a capture error must not be hidden), else record the key in
    FAILED, warn once and return CompileFailed for the launcher to raise (dispatch/launch.py: the
    next default rule runs, or a call that named this variant raises)."""
    if q.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise e
    k = key(kc, q)
    FAILED[k] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    warnings.warn(f"sparse MLA: the {name} did not compile here ({FAILED[k]})",
                  stacklevel=4)  # fmt: skip
    return CompileFailed(FAILED[k])


def rows_aligned(*strided: tuple[int, int], tensors: tuple[torch.Tensor, ...]) -> bool:
    """cp.async moves 16 bytes: every (stride, elements per 16 B) divides and every tensor
    starts 16-byte aligned."""
    return not (any(st % m for st, m in strided) or any(t.data_ptr() % 16 for t in tensors))


def usable(plan: LaunchPlan, kc: dict, smem: int) -> bool:
    """The checks every Gluon variant ends with: a Hopper GPU with Gluon, the shared-memory
    budget, and no earlier compile failure of this launch's key."""
    return (gluon_device(plan.p.device) and smem <= SMEM_LIMIT
            and key(kc, plan.p.q) not in FAILED)  # fmt: skip
