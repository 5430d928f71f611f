"""The launch plan of one split-KV call: what every variant's launcher reads, built once.

`Problem` holds the call (tensors, shapes, cache format, output buffers), checked once.
`LaunchPlan` adds one variant's geometry: splits, the merge, the split kernel's destination
(the output, or a [B, S, H, d_v] workspace of partials) and the strides the kernels take.
Launchers take a plan, not positional arguments: they cannot disagree on what they launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton

from ..reference import check_inputs
from .geometry import MAX_SPLITS, MergePolicy, SplitConfig, choose_num_splits, resolve_merge

if TYPE_CHECKING:
    from ..fp8 import Fp8KVCache

LOG2E = 1.4426950408889634


def num_sms(device: torch.device) -> int:
    """The device's SM count (the split count and the grid order are chosen from it)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8  # interpreter: any small number; only exercises the multi-split path


@dataclass(frozen=True, slots=True, eq=False)
class Problem:
    """One decode call, checked: q [B, H, D_qk], the cache (16-bit [T, D_qk] or FP8 layout),
    indices [B, topk] int32, and the output buffers out [B, H, d_v] / lse [B, H] fp32."""

    q: torch.Tensor
    kv: torch.Tensor | Fp8KVCache
    indices: torch.Tensor
    sm_scale: float
    d_v: int
    b: int
    h: int
    d_qk: int
    topk: int
    out: torch.Tensor
    lse: torch.Tensor
    num_sms: int

    @property
    def fp8(self) -> bool:
        return not isinstance(self.kv, torch.Tensor)

    @property
    def cache(self) -> str:
        """The cache format: "16bit" or "fp8"."""
        return "fp8" if self.fp8 else "16bit"

    @property
    def fp8_tile(self) -> int | None:
        return self.kv.tile if self.fp8 else None

    @property
    def d_tail(self) -> int:
        """Score-only columns after d_v (V3.2: 64)."""
        return self.d_qk - self.d_v

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def interpreted(self) -> bool:
        return self.q.device.type == "cpu"

    @property
    def f32_dot(self) -> bool:
        """fp32 operands with IEEE dots: fp32 inputs, and bf16 in the interpreter (whose bf16
        tl.dot is wrong on the CPU)."""
        return self.q.dtype == torch.float32 or (self.interpreted and
                                                 self.q.dtype == torch.bfloat16)  # fmt: skip


def make_problem(q: torch.Tensor, kv: torch.Tensor | Fp8KVCache, indices: torch.Tensor,
                 sm_scale: float, d_v: int, out: torch.Tensor | None,
                 lse: torch.Tensor | None) -> Problem:  # fmt: skip
    """Check the call's tensors (ValueError naming what is wrong) and allocate the outputs."""
    if isinstance(kv, torch.Tensor):
        b, h, d_qk, topk = check_inputs(q, kv, indices, d_v)
        main = kv
    else:
        if kv.rope.dtype != q.dtype:
            raise ValueError(f"FP8 cache's 16-bit part is {kv.rope.dtype}, q is {q.dtype}")
        # Shape checks on a stand-in with the logical [T, D_qk] shape (no copy).
        stand_in = kv.rope.new_empty(1, 1).expand(kv.rope.shape[0], kv.d_qk)
        b, h, d_qk, topk = check_inputs(q, stand_in, indices, d_v)
        if kv.d_fp8 > d_v:
            raise ValueError(f"FP8 part ({kv.d_fp8} columns) must lie within d_v={d_v}")
        main = kv.data
    if q.stride(-1) != 1 or main.stride(-1) != 1 or indices.stride(-1) != 1:
        raise ValueError("q, kv_cache and indices need a contiguous last dimension")
    if out is None:
        out = torch.empty((b, h, d_v), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((b, h), dtype=torch.float32, device=q.device)
    return Problem(q, kv, indices, sm_scale, d_v, b, h, d_qk, topk, out, lse, num_sms(q.device))


@dataclass(frozen=True, slots=True, eq=False)
class LaunchPlan:
    """One variant's launch of a Problem: geometry, splits, merge and destination."""

    p: Problem
    cfg: SplitConfig
    num_splits: int
    tiles_per_split: int
    merge: str  # "single" (the split kernel writes the output), "kernel" or "pdl"
    o_dst: torch.Tensor  # out [B, H, d_v] (single) or partials [B, S, H, d_v]
    lse_dst: torch.Tensor  # lse [B, H] (single) or partials [B, S, H] fp32

    @property
    def single(self) -> bool:
        return self.num_splits == 1

    @property
    def n_hblk(self) -> int:
        return triton.cdiv(self.p.h, self.cfg.block_h)

    @property
    def grid(self) -> tuple[int, int, int]:
        """(B, head blocks, splits); a launcher may reorder it (gluon_common.grid_order)."""
        return (self.p.b, self.n_hblk, self.num_splits)

    @property
    def so(self) -> tuple[int, int, int]:
        """Strides of o_dst: request, split (0 when single), head."""
        o = self.o_dst
        return (o.stride(0), 0, o.stride(1)) if self.single else (o.stride(0), o.stride(1),
                                                                  o.stride(2))  # fmt: skip

    @property
    def sl(self) -> tuple[int, int]:
        """Strides of lse_dst: request, split (0 when single)."""
        x = self.lse_dst
        return (x.stride(0), 0) if self.single else (x.stride(0), x.stride(1))

    @property
    def scale_log2(self) -> float:
        return self.p.sm_scale * LOG2E

    @property
    def block_dv(self) -> int:
        return max(triton.next_power_of_2(self.p.d_v), 16)

    @property
    def partials(self) -> str:
        """The partials' dtype ("" when single), as the launch record names it."""
        return "" if self.single else str(self.o_dst.dtype).removeprefix("torch.")


def make_plan(p: Problem, cfg: SplitConfig, num_splits: int | None, merge_policy: MergePolicy,
              pdl_ok: bool, workspace: tuple[torch.Tensor, torch.Tensor] | None) -> LaunchPlan:  # fmt: skip
    """Splits (chosen from B, H, topk and the SM count unless given), the merge, and the
    destination: out/lse for one split, else `workspace` (checked) or new partials in the
    config's partial dtype."""
    n_tiles = max(triton.cdiv(p.topk, cfg.block_n), 1)
    if num_splits is None:
        num_splits = choose_num_splits(p.b, p.h, p.topk, cfg, p.num_sms)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    # Splits past the last tile would see nothing; they still run and write (0, -inf).
    tiles_per_split = triton.cdiv(n_tiles, min(num_splits, n_tiles))
    merge = resolve_merge(cfg, p.b, p.h, num_splits, p.num_sms, merge_policy, pdl_ok)
    if num_splits == 1:
        return LaunchPlan(p, cfg, 1, tiles_per_split, merge, p.out, p.lse)
    want = (p.b, num_splits, p.h, p.d_v)
    if workspace is None:
        dtype = torch.float32 if cfg.partial_dtype == "fp32" else p.q.dtype
        workspace = (torch.empty(want, dtype=dtype, device=p.device),
                     torch.empty(want[:3], dtype=torch.float32, device=p.device))  # fmt: skip
    o, lse = workspace
    if (tuple(o.shape) != want or tuple(lse.shape) != want[:3]
            or o.dtype not in (torch.float32, p.q.dtype) or lse.dtype != torch.float32):  # fmt: skip
        raise ValueError(f"workspace must be ([B, S, H, d_v], [B, S, H]) = ({list(want)}, "
                         f"{list(want[:3])}) (O fp32 or q's dtype, lse fp32)")  # fmt: skip
    return LaunchPlan(p, cfg, num_splits, tiles_per_split, merge, o, lse)
