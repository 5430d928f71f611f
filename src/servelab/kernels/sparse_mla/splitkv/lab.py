"""Lab options of the split kernels: diagnostics and experiment switches, for benchmarks/ only.

Product code never passes these (the engine, `sparse_mla_decode`): a launch without them runs
the measured kernels as they ship. A benchmark passes a `Lab` to `dispatch.splitkv_launch` to
time a kernel with a part removed (wrong results, timing only), to read the warp-specialised
kernel's phase trace, or to re-time a switch against its shipped setting. A variant that does
not implement what a Lab asks for does not serve the launch (the launch record says so).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# What each `drop` removes (wrong results, timing only) and which variants implement it.
DROPS = {
    "": "nothing",
    "qk": "the score dot (triton)",
    "pv": "the P V dot (triton)",
    "gather": "the loop's gathers (gluon_*)",
    "dots": "both dots (gluon_*)",
    "dequant": "the dequantisation into the staging tile (gluon_fp8, gluon_nh_fp8)",
}
# The Gluon kernels' DROP constexpr for each of their diagnostics.
GLUON_DROP = {"": 0, "gather": 1, "dots": 2, "dequant": 3}


@dataclass(frozen=True, slots=True, eq=False)
class Lab:
    """Diagnostics and switches; the defaults are the shipped kernels.

    - drop: a part of the kernel left out (`DROPS`).
    - trace: an int64 tensor receiving gluon_ws's per-program phase stamps
      (gluon_ws_trace.TRACE_LAYOUT; >= programs x TRACE_COLS entries).
    - staged_stores: gluon_ws / gluon_fp8 store 16-bit O through a free shared buffer in whole
      row segments (shipped since the ninth follow-up); False: from the accumulator's layout.
    - q_after_indices: gluon_ws issues q's copies once the loader has the first tile's
      indices (shipped); False: at entry.
    - heads_first: gluon_ws's grid (head blocks, B, splits) where the programs outnumber the
      SMs (shipped, gluon_common.grid_order); False: (B, head blocks, splits).
    - merge: keyword overrides of merge.launch_merge (its geometry: num_warps, block_dvc,
      tile_elems, s_chunk, column_warps; and trace, the merge programs' SM and timer stamps).
    """

    drop: str = ""
    trace: torch.Tensor | None = None
    staged_stores: bool = True
    q_after_indices: bool = True
    heads_first: bool = True
    merge: dict | None = None

    def __post_init__(self) -> None:
        if self.drop not in DROPS:
            raise ValueError(f"drop must be one of {sorted(DROPS)}, got {self.drop!r}")


SHIPPED = Lab()
