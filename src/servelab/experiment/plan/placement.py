"""Which Ray node each process of an experiment would land on, from the cluster's resources.

`run --check` shows it per arm and process and refuses a plan the cluster cannot place (one
line: the process, what it asks, what the cluster has); the runner refuses to wait for a
process no live node could ever hold (deploy/ray_hosts.py). A process lands on a node whose
free resources cover its asks (Ray's names: CPU, GPU, custom resources, `node:<ip>`) and whose
labels match its label selector (deploy/ray_nodes.py `Node.fits`); arms deployed one after
another each see the cluster as it is now, and with `restart = "block"` every arm of a block
is up at once, so their asks add up.
"""

from __future__ import annotations

from servelab.errors import UserError
from servelab.experiment.deploy.ray_nodes import cluster_text, connect, nodes, unplaceable
from servelab.experiment.design.model import ExperimentSpec
from servelab.experiment.plan import processes


def predict(spec: ExperimentSpec, source: str | None = None) -> dict[str, list[dict | None]]:
    """Per arm, per process in launch order: the node it would land on ({node_id, ip,
    candidates}), or None for a local process. UserError (one line) when the cluster cannot
    place one."""
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
