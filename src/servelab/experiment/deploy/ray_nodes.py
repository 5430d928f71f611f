"""The Ray cluster as the runner (the Ray driver) sees it: the ray module, joining the cluster,
and its live nodes with their resources and labels, so that placement (plan/placement.py
predicts, deploy/ray_hosts.py places) and its one-line refusals read the same view.

Ray is imported only inside these functions: this module is importable without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servelab.engines.launcher import Placement
from servelab.errors import UserError


def require_ray(source: str = "<experiment>") -> Any:
    """The ray module, or a one-line UserError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError(
            f"{source}: placement = \"ray\" needs Ray, which is not installed: "
            "pip install 'servelab[ray]'"
        ) from None
    return ray


def connect(address: str | None) -> Any:
    """Join the cluster at `address` once per process (None: as ray.init() does: RAY_ADDRESS,
    a cluster started on this machine, else a new local one)."""
    ray = require_ray()
    if not ray.is_initialized():
        import logging

        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserError(
                f"cannot join the Ray cluster at {address or '(Ray default)'}: {first}; start "
                "one with `ray start --head` (docs/EXPERIMENTS.md) or set ray_address"
            ) from None
    return ray



_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Node:
    """A live node of the cluster as Ray reports it."""

    node_id: str
    ip: str
    total: dict[str, float]
    free: dict[str, float]
    labels: dict[str, str] = field(default_factory=dict)

    def fits(self, pl: Placement, have: dict[str, float] | None = None) -> bool:
        """Whether `pl` can run here with `have` (default: the node's total) resources."""
        have = self.total if have is None else have
        if any(self.labels.get(k) != v for k, v in pl.node_labels):
            return False
        return all(have.get(k, 0.0) + _EPS >= v for k, v in pl.asks().items())

    def short(self) -> str:
        return f"{self.ip} ({self.node_id[:8]})"

    def to_json(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "ip": self.ip}


def _shown(res: dict[str, float]) -> str:
    """A node's resources as `CPU=2, node:prefill=1` (Ray's bookkeeping entries left out)."""
    keep = {k: v for k, v in res.items()
            if k not in ("memory", "object_store_memory") and not k.startswith("node:__")
            and not (k.startswith("node:") and v < 1)}
    return ", ".join(f"{k}={v:g}" for k, v in sorted(keep.items())) or "nothing"


def nodes(ray: Any) -> list[Node]:
    """The live nodes, with their free resources now (Ray's per-node view; where this Ray
    version does not expose it, the totals)."""
    try:
        from ray._private.state import available_resources_per_node  # a DeveloperAPI: no public one

        free_by_id: dict[str, dict[str, float]] = available_resources_per_node()
    except (ImportError, AttributeError, RuntimeError):
        free_by_id = {}
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        total = {k: float(v) for k, v in (n.get("Resources") or {}).items()}
        out.append(Node(
            node_id=n["NodeID"], ip=n.get("NodeManagerAddress", "?"), total=total,
            free={k: float(v) for k, v in free_by_id.get(n["NodeID"], total).items()},
            labels={str(k): str(v) for k, v in (n.get("Labels") or {}).items()},
        ))
    return out


def cluster_text(live: list[Node], free: bool = True) -> str:
    """What the cluster has, per node (for one-line refusals)."""
    if not live:
        return "no live node"
    def labels(n: Node) -> str:
        own = {k: v for k, v in sorted(n.labels.items()) if not k.startswith("ray.io/")}
        return "".join(f", label {k}={v}" for k, v in own.items())

    return "; ".join(f"node {n.short()}: {_shown(n.free if free else n.total)}{labels(n)}"
                     for n in live)


def unplaceable(pl: Placement, role: str, live: list[Node]) -> str | None:
    """Why no live node could ever hold the process (even idle), or None."""
    if any(n.fits(pl) for n in live):
        return None
    return (f"no node of the Ray cluster can hold the {role} process: it asks "
            f"{pl.describe()}; the cluster has {cluster_text(live, free=False)}")
