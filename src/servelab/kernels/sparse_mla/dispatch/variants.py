"""The split kernels, one registry: what each serves and how it launches.

Every variant's module exposes the same two functions of a launch plan (plan.LaunchPlan) and
the lab options (lab.Lab):

- ``serves(plan, lab) -> bool``: whether it can run this launch here (cache format, geometry,
  layout, device, shared memory, no earlier compile failure);
- ``launch(plan, lab)``: launch the split kernel into plan.o_dst / plan.lse_dst; returns the
  compiled kernel, or None where a Gluon kernel did not compile (Triton errors propagate).

Modules are imported on first use (Triton is imported only when a kernel is needed, so that
TRITON_INTERPRET set before the first call takes effect); functions are looked up on the module
at each call, so a test can replace one.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from ..splitkv.geometry import KERNELS

_KERNELS_PKG = __package__.rpartition(".")[0]  # servelab.kernels.sparse_mla


@dataclass(frozen=True, slots=True)
class Variant:
    """One split kernel: its name (SplitConfig.kernel), the caches it reads, where it lives."""

    name: str
    caches: tuple[str, ...]  # "16bit", "fp8"
    module: str  # under servelab.kernels.sparse_mla, e.g. "gluon_kernels.ws"
    serves_fn: str = "serves"
    launch_fn: str = "launch"
    pdl_trigger: bool = False  # triggers the PDL merge's early launch (else "pdl" -> "kernel")
    gluon: bool = False  # Hopper only
    summary: str = ""

    def impl(self) -> ModuleType:
        return importlib.import_module(f"{_KERNELS_PKG}.{self.module}")

    def serves(self, plan, lab) -> bool:
        return plan.p.cache in self.caches and getattr(self.impl(), self.serves_fn)(plan, lab)

    def launch(self, plan, lab):
        return getattr(self.impl(), self.launch_fn)(plan, lab)


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("triton", ("16bit", "fp8"), "triton_kernels.split", pdl_trigger=True,
            summary="Triton, any GPU: heads on MMA M; FP8 dequantised through a reshape"),
    Variant("triton_rp", ("16bit",), "triton_kernels.rp", pdl_trigger=True,
            summary="Triton, the next tile's gather issued into registers before the dots"),
    Variant("triton_fp8_chunked", ("fp8",), "triton_kernels.fp8_chunked", pdl_trigger=True,
            summary="Triton, FP8 scales folded into the products per column chunk"),
    Variant("gluon_ws", ("16bit",), "gluon_kernels.ws", gluon=True,
            summary="Gluon (Hopper), warp-specialised: loader / scorer / second half"),
    Variant("gluon_fp8", ("fp8",), "gluon_kernels.fp8", gluon=True,
            summary="Gluon (Hopper), FP8 ring dequantised once per tile into fp16"),
    Variant("gluon_nh", ("16bit",), "gluon_kernels.nh", gluon=True,
            summary="Gluon (Hopper), <= 32 heads on the wgmma N dimension"),
    Variant("gluon_nh_fp8", ("fp8",), "gluon_kernels.nh", "serves_fp8", "launch_fp8", gluon=True,
            summary="Gluon (Hopper), <= 32 heads on wgmma N, FP8 cache"),
)}  # fmt: skip
assert tuple(VARIANTS) == KERNELS, "geometry.KERNELS names the registry's variants"
