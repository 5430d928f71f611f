"""The placement keys of an experiment file: where processes run, and what a process asks of
the Ray node it runs on (docs/EXPERIMENTS.md, "Placement on a Ray cluster").

`placement` ("local" | "ray") is set for the experiment, an arm (for the processes its delta
applies to) or a process; the asks are the process's (`RayAsks`, the base of design/model.py's
ProcessSpec). Errors are ValueErrors that design/parse.py turns into one line naming the key.
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from servelab.experiment.design.base import Strict

if TYPE_CHECKING:
    from servelab.experiment.design.model import ExperimentSpec

Where = Literal["local", "ray"]
_RAY_ADDRESS = re.compile(r"^(auto|ray://[^\s/:]+:\d{1,5}|[^\s/:]+:\d{1,5})$")
_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.\-/]{0,251}[A-Za-z0-9])?$")
# the asks of a process that only mean something on a Ray cluster (experiment/deploy/ray_hosts.py)
RAY_ASKS = ("num_cpus", "num_gpus", "resources", "node_ip", "node_labels")


class RayAsks(Strict):
    """Where a process runs and, on Ray, what it asks of its node (Ray's own names)."""

    placement: Where | None = None  # default: the experiment's
    num_cpus: float | None = Field(None, ge=0, le=4096, allow_inf_nan=False)
    num_gpus: float | None = Field(None, ge=0, le=1024, allow_inf_nan=False)
    resources: dict[str, float] = {}  # Ray custom resources, e.g. { "node:prefill" = 1 }
    node_ip: str | None = None  # the node with this IP (Ray's node:<ip> resource)
    node_labels: dict[str, str] = {}  # Ray node labels (`ray start --labels`), exact values

    @field_validator("resources")
    @classmethod
    def _resources(cls, v: dict[str, float]) -> dict[str, float]:
        for k, q in v.items():
            if k in ("CPU", "GPU"):
                raise ValueError(f"ask for {k} with num_{k.lower()}s, not in resources")
            if not k or not (q > 0 and math.isfinite(q)):
                raise ValueError(f"resource '{k}' must be a name with an amount > 0 (e.g. 1)")
        return v

    @field_validator("node_ip")
    @classmethod
    def _ip(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                ipaddress.ip_address(v)
            except ValueError:
                raise ValueError(f"'{v}' is not an IP address (e.g. \"10.0.0.2\")") from None
        return v

    @field_validator("node_labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not _LABEL.match(k) or not _LABEL.match(val):
                raise ValueError(
                    f"label {k} = {val!r}: keys and values are letters, digits, '-', '_', '.' "
                    "(keys also '/'), starting and ending with a letter or digit"
                )
        return v

    def ray_asks(self) -> list[str]:
        """The Ray-only keys this process sets."""
        return [k for k in RAY_ASKS if getattr(self, k) not in (None, {})]


def check_placement(spec: ExperimentSpec) -> None:
    """Placement keys make sense together: an address Ray understands, asks only where a
    process may run on Ray, GPUs from Ray rather than the env."""
    procs = spec.base.processes or []
    on_ray = spec.uses_ray
    if spec.ray_address is not None and not _RAY_ADDRESS.match(spec.ray_address):
        raise ValueError(
            f"ray_address '{spec.ray_address}' must be \"auto\", \"ray://host:port\" or "
            '"host:port" (leave it out to start or join Ray as ray.init() does)'
        )
    if spec.ray_address is not None and not on_ray:
        raise ValueError('ray_address is used only with placement = "ray"')
    if on_ray and spec.engine == "external":
        raise ValueError("engine 'external' is not launched by servelab: placement does not apply")
    for i, p in enumerate(procs):
        asks = p.ray_asks()
        if asks and not on_ray:
            raise ValueError(
                f"base.processes.{i} ({p.role}) sets {asks[0]}, which only applies with "
                'placement = "ray" (for the experiment, an arm or this process)'
            )
        if p.num_gpus and "CUDA_VISIBLE_DEVICES" in {**spec.base.env, **p.env}:
            raise ValueError(
                f"base.processes.{i} ({p.role}): CUDA_VISIBLE_DEVICES comes from the GPUs "
                "Ray gives the process (num_gpus); remove it from env"
            )


def drop_unset_placement(d: dict[str, Any]) -> None:
    """Placement keys left at their defaults are left out of the design hash, so experiments
    stored before placement existed resume as before."""
    if d.get("placement") == "local":
        d.pop("placement")
    for arm in d["arms"].values():
        if arm.get("placement") is None:
            arm.pop("placement", None)
    for p in (d.get("base") or {}).get("processes") or []:
        for k in ("placement", *RAY_ASKS):
            if p.get(k) in (None, {}):
                p.pop(k, None)
