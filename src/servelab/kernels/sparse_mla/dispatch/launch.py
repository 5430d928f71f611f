"""Split-KV decode: choose a variant, launch it and the merge, and say what ran.

A call is checked once (plan.Problem), and each variant tried gets one frozen LaunchPlan
(normally one: the first rule serves). With ``config`` a call names its variant (config.kernel):
that variant runs or the call raises. Without, the rules of the GPU's defaults file
(dispatch/defaults.py) that match the call are tried in order: a variant that cannot serve the launch
(another GPU, a layout, a compile failure, shared memory) is skipped and the next rule runs.
The returned `SplitRun` carries a `Ran` record: which variant ran, its tile, splits, merge and
partials, the rule it came from and the rules skipped on the way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from triton.runtime.errors import OutOfResources

from ..gluon_kernels.common import CompileFailed
from ..splitkv import merge as merge_mod
from ..splitkv.geometry import SplitConfig
from ..splitkv.lab import SHIPPED, Lab
from ..splitkv.plan import LaunchPlan, make_plan, make_problem
from . import defaults as defaults_mod
from .variants import VARIANTS

if TYPE_CHECKING:
    from ..fp8 import Fp8KVCache


@dataclass(frozen=True, slots=True)
class Ran:
    """What one split-KV call ran (the record tests and benchmarks read)."""

    variant: str  # variants.VARIANTS key
    tile: str  # heads x tokens per tile, e.g. "64x64"
    num_splits: int
    merge: str  # "single" (no merge), "kernel" or "pdl"
    partials: str  # the partials' dtype, "" with one split
    rule: int | None  # the defaults rule it came from; None: the call named its config
    skipped: tuple[str, ...] = ()  # rules tried first: "variant (rule i): why"
    # The compiled split and merge kernels (register / spill / shared-memory reports).
    compiled: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True, eq=False)
class SplitRun:
    out: torch.Tensor  # [B, H, d_v]
    lse: torch.Tensor  # [B, H] fp32
    ran: Ran


def _try(plan: LaunchPlan, lab: Lab) -> tuple[bool, object, str]:
    """Launch the plan's variant: (True, compiled split kernel or None in the interpreter, "")
    or (False, None, why it did not run)."""
    variant = VARIANTS[plan.cfg.kernel]
    if lab.trace is not None and variant.name != "gluon_ws":
        return False, None, "the phase trace is gluon_ws's"
    if not variant.serves(plan, lab):
        return False, None, (f"does not serve this launch ({plan.p.cache} cache, "
                             f"{plan.cfg.tile} tiles)")  # fmt: skip
    try:
        return True, variant.launch(plan, lab), ""
    except OutOfResources as e:
        return False, None, f"needs more shared memory than this GPU has ({e})"
    except CompileFailed:
        return False, None, "did not compile here"


def splitkv_launch(
    q: torch.Tensor,  # [B, H, D_qk]
    kv_cache: torch.Tensor | Fp8KVCache,  # [T, D_qk], or the FP8 layout of fp8.py
    indices: torch.Tensor,  # [B, topk] int32, -1 = padding
    sm_scale: float,
    d_v: int,
    *,
    config: SplitConfig | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,  # [B, H, d_v]
    lse: torch.Tensor | None = None,  # [B, H] fp32
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,  # partials, with num_splits
    lab: Lab | None = None,  # benchmarks only (splitkv/lab.py)
) -> SplitRun:
    """Run the split kernel (the named config's, or the first default rule that serves) and
    the merge when there are several splits; returns out, lse and the `Ran` record."""
    p = make_problem(q, kv_cache, indices, sm_scale, d_v, out, lse)
    lab = lab or SHIPPED
    dflt = defaults_mod.for_device(p.device)
    if config is not None:
        tries = [(None, config)]
    else:
        tries = [(r.index, r.config) for r in dflt.candidates(p.b, p.h, p.d_qk, p.fp8_tile)]
    skipped: list[str] = []
    for rule, cfg in tries:
        variant = VARIANTS[cfg.kernel]
        pdl_ok = variant.pdl_trigger and merge_mod.pdl_supported(p.device)
        plan = make_plan(p, cfg, num_splits, dflt.merge, pdl_ok, workspace)
        ok, compiled, why = _try(plan, lab)
        if ok:
            break
        if config is not None:
            raise ValueError(f"split kernel {cfg.kernel!r} cannot run this call: {why}; "
                             f"{variant.summary}")  # fmt: skip
        skipped.append(f"{cfg.kernel} (rule {rule}): {why}")
    else:
        raise RuntimeError("no split kernel ran this call: " + "; ".join(skipped))
    kernels = {"split": compiled}
    if not plan.single:
        kernels["merge"] = merge_mod.launch_merge((plan.o_dst, plan.lse_dst), p.out, p.lse,
                                                  pdl=plan.merge == "pdl",
                                                  **(lab.merge or {}))  # fmt: skip
    ran = Ran(cfg.kernel, cfg.tile, plan.num_splits, plan.merge, plan.partials, rule,
              tuple(skipped), kernels)  # fmt: skip
    return SplitRun(p.out, p.lse, ran)


def splitkv_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor | Fp8KVCache,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`splitkv_launch` returning (out, lse) only (what an engine's attention call wants)."""
    run = splitkv_launch(q, kv_cache, indices, sm_scale, d_v, **kwargs)
    return run.out, run.lse
