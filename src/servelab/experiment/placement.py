"""Which Ray node each process of an experiment would land on, from the cluster's resources.

`run --check` shows it per arm and process and refuses a plan the cluster cannot place (one
line: the process, what it asks, what the cluster has); the runner refuses to wait for a
process no live node could ever hold. A process lands on a node whose free resources cover
its asks (Ray's names: CPU, GPU, custom resources, `node:<ip>`) and whose labels match its
label selector; arms deployed one after another each see the cluster as it is now, and with
`restart = "block"` every arm of a block is up at once, so their asks add up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servelab.engines.launcher import Placement
from servelab.errors import UserError

if TYPE_CHECKING:
    from servelab.experiment.spec import ExperimentSpec

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


def predict(spec: ExperimentSpec, source: str | None = None) -> dict[str, list[dict | None]]:
    """Per arm, per process in launch order: the node it would land on ({node_id, ip,
    candidates}), or None for a local process. UserError (one line) when the cluster cannot
    place one."""
    from servelab.experiment import processes
    from servelab.experiment.ray_hosts import connect

    live = nodes(connect(spec.ray_address))
    groups = [list(spec.arms)] if spec.restart == "block" else [[a] for a in spec.arms]
    out: dict[str, list[dict | None]] = {}
    for arms in groups:
        free = {n.node_id: dict(n.free) for n in live}
        for arm in arms:
            out[arm] = []
            for cfg in processes.resolve(spec, arm):
                pl = cfg.placement
                if not pl.ray:
                    out[arm].append(None)
                    continue
                fit = [n for n in live if n.fits(pl, free[n.node_id])]
                if not fit:
                    why = unplaceable(pl, cfg.role, live)
                    raise UserError(
                        (f"{source}: " if source else "") + f"arms.{arm} ({cfg.role}): "
                        + (why or f"no node has room for it now: it asks {pl.describe()}"
                           + (" with every arm of a block up (restart = \"block\")"
                              if len(arms) > 1 else "")
                           + f"; free: {cluster_text(live)}")
                    )
                node = fit[0]
                for k, v in pl.asks().items():
                    free[node.node_id][k] = free[node.node_id].get(k, 0.0) - v
                out[arm].append({**node.to_json(), "candidates": len(fit)})
    return out
