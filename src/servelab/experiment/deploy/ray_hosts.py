"""Processes placed on a Ray cluster, seen from the runner (the Ray driver).

`place` starts one small actor (deploy/ray_actor.py) with the process's asks (CPUs,
GPUs, custom resources, a node IP, node labels) and waits until Ray has put it on a node;
the deployment (deploy/deployment.py) then plans the process there: ports found free by the
actor on its node, the node's address in the process's URL and in the commands of the
processes after it (the router's --prefill/--decode URLs), CUDA_VISIBLE_DEVICES from the GPU
ids Ray gave the actor. `RayProcess` offers the deployment the same methods as a local
process: readiness, status, log tail (copied from the node as it grows into the
experiment's log folder), teardown. A dead node or actor makes the process `lost` with the
reason (e.g. "node 10.0.0.3 (5f2a9c1e) of the decode process died").
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from servelab import atomic
from servelab.engines.base import Engine, ProcessConfig, ProcessPlan
from servelab.engines.launcher import Launcher
from servelab.errors import UserError
from servelab.experiment.deploy.base import DeployError, Running, launch_line, tail
from servelab.experiment.deploy.local import Site
from servelab.experiment.deploy.ray_actor import EngineHost
from servelab.experiment.deploy.ray_nodes import cluster_text, connect, nodes, unplaceable

CALL_S = 30.0  # a status call to a live actor answers in milliseconds; a dead one raises
FOLLOW_S = 2.0  # how often the node's log is copied while the process runs


@functools.cache
def _actor_class() -> Any:
    import ray

    return ray.remote(EngineHost)


def place(cfgs: list[ProcessConfig], timeout_s: float) -> list[Site]:
    """A site per process: this host for a local one, else an actor on a node that has what
    the process asks. The actors are requested together (their workers start in parallel);
    DeployError when no live node could hold one, or Ray has not placed one within
    `timeout_s`. Nothing is left behind on failure."""
    ray = connect(next(c.placement.address for c in cfgs if c.placement.ray))
    live = nodes(ray)
    for c in cfgs:
        why = c.placement.ray and unplaceable(c.placement, c.role, live)
        if why:
            raise DeployError(why)
    actors = [_request(c) if c.placement.ray else None for c in cfgs]
    deadline = time.monotonic() + timeout_s
    sites: list[Site] = []
    try:
        for c, actor in zip(cfgs, actors, strict=True):
            if actor is None:
                sites.append(Site(c.host))
                continue
            try:
                info = ray.get(actor.where.remote(),
                               timeout=max(1.0, deadline - time.monotonic()))
            except ray.exceptions.GetTimeoutError:
                raise DeployError(
                    f"Ray did not place the {c.role} process within {timeout_s:.0f} s: it asks "
                    f"{c.placement.describe()}; free now: "
                    f"{cluster_text(nodes(ray))}"
                ) from None
            except ray.exceptions.RayError as exc:
                raise DeployError(
                    f"the Ray actor of the {c.role} process failed: {_first(exc)}") from None
            sites.append(RaySite(actor, info, c))
    except BaseException:
        for actor in actors:
            if actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
        raise
    return sites


def _request(cfg: ProcessConfig) -> Any:
    """Ask Ray for the process's actor (placed asynchronously)."""
    pl = cfg.placement
    opts: dict[str, Any] = {
        "num_cpus": pl.num_cpus, "num_gpus": pl.num_gpus, "max_restarts": 0,
        "resources": {k: v for k, v in pl.asks().items() if k not in ("CPU", "GPU")},
    }
    if pl.node_labels:
        opts["label_selector"] = dict(pl.node_labels)
    try:
        return _actor_class().options(**opts).remote()
    except (ValueError, TypeError) as exc:  # e.g. a Ray without label selectors
        import ray

        raise UserError(f"Ray {ray.__version__} refuses the {cfg.role} process's asks "
                        f"({pl.describe()}): {_first(exc)}") from None


def _first(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__


class RaySite(Site):
    """A node chosen by Ray, reached through the process's actor."""

    def __init__(self, actor: Any, info: dict[str, Any], cfg: ProcessConfig) -> None:
        super().__init__(info["ip"])
        self.actor, self.info, self.role = actor, info, cfg.role
        self.asks = cfg.placement.describe()
        if cfg.placement.num_gpus:  # the engine sees exactly the GPUs Ray gave its actor
            self.env = {"CUDA_VISIBLE_DEVICES": ",".join(info["gpus"])}

    def call(self, method: str, *args: Any, timeout: float = CALL_S) -> Any:
        import ray

        return ray.get(getattr(self.actor, method).remote(*args), timeout=timeout)

    def launcher(self, launcher: Launcher, engine: Engine) -> Launcher:
        # servelab's own engine runs in servelab's Python: the node's, not the driver's
        if engine.name == "embedded" and not launcher.python:
            return replace(launcher, python=self.info["python"])
        return launcher

    def free_port(self, taken: set[int]) -> int:
        return int(self.call("free_port", self.address, sorted(taken)))

    def launch(self, plan: ProcessPlan, log_path: Path, base_env: dict[str, str],
               port_free_s: float) -> Running:
        got = self.call("launch", plan, port_free_s, timeout=port_free_s + CALL_S)
        if "error" in got:
            raise DeployError(f"{got['error']} (node {self.short()})")
        return RayProcess(self, plan, log_path)

    def short(self) -> str:
        return f"{self.address} ({self.info['node_id'][:8]})"

    def node(self) -> dict[str, Any]:
        """For provenance: where the process ran and what it asked for."""
        keys = ("node_id", "ip", "hostname", "gpus", "node_gpus", "python", "ray_version")
        return {"placement": "ray", "asks": self.asks, **{k: self.info[k] for k in keys}}

    def gone(self, exc: BaseException) -> str:
        """Why the actor stopped answering: its node died (as Ray's cluster table says, within
        a few seconds of the failed call), or the actor alone did."""
        import ray

        deadline = time.monotonic() + 5.0
        while True:
            with contextlib.suppress(Exception):
                for n in ray.nodes():
                    if n.get("NodeID") == self.info["node_id"] and not n.get("Alive"):
                        msg = n.get("DeathReasonMessage") or ""
                        return (f"node {self.short()} of the {self.role} process died"
                                + (f" ({msg})" if msg else ""))
            if time.monotonic() > deadline:
                return (f"the Ray actor of the {self.role} process on node {self.short()} "
                        f"died: {_first(exc)}")
            time.sleep(0.2)

    def close(self) -> None:
        """Kill the actor and wait (up to 10 s) until Ray reports it dead, so its resources are
        being released when the deployment's teardown returns (ray.kill alone is asynchronous:
        the next plan could see the node still held)."""
        import ray

        with contextlib.suppress(Exception):
            ray.kill(self.actor)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                ray.get(self.actor.poll.remote(), timeout=1.0)
            except ray.exceptions.GetTimeoutError:
                continue
            except Exception:  # noqa: BLE001 - dead (ActorDiedError) or unreachable: done
                return
            time.sleep(0.05)


class RayProcess:
    """One process on a Ray node, driven through its actor (deploy.Running)."""

    def __init__(self, site: RaySite, plan: ProcessPlan, log_path: Path) -> None:
        self.site, self.plan, self.log_path = site, plan, log_path
        self.offset = 0
        self._lost: str | None = None
        self._lock = threading.Lock()
        self._log: IO[bytes] | None = atomic.open_append(log_path)  # 0600, no link; closed in terminate
        self._log.write(launch_line(plan.argv) + f"# on node {site.short()}\n".encode())
        self._log.flush()
        self._stop = threading.Event()
        self._follower = threading.Thread(target=self._follow, daemon=True)
        self._follower.start()

    def _append(self, data: bytes) -> None:
        if data and self._log is not None:
            self._log.write(data)
            self._log.flush()
            self.offset += len(data)

    def _pull(self) -> None:
        """Copy what the node's log gained (quietly nothing when the actor is gone)."""
        with self._lock:
            if self._lost or self._log is None:
                return
            with contextlib.suppress(Exception):
                while data := self.site.call("read", self.offset):
                    self._append(data)

    def _follow(self) -> None:
        while not self._stop.wait(FOLLOW_S):
            self._pull()

    def poll(self) -> int | None:
        if self._lost:
            return -1
        try:
            code = self.site.call("poll")
        except Exception as exc:  # noqa: BLE001 - any failure of the actor is a loss
            self._lost = self.site.gone(exc)
            return -1
        if code is not None:
            self._pull()
            self._lost = (f"the {self.plan.role} process on node {self.site.short()} exited "
                          f"with status {code}")
        return code

    def lost(self) -> str | None:
        self.poll()
        return self._lost

    def tail(self, lines: int = 40) -> str:
        self._pull()
        return tail(self.log_path, lines)

    def where(self) -> str:
        return f"{self.log_path}, node {self.site.short()}"

    def pids(self) -> list[int]:
        return []  # the node's processes are its actor's to manage

    def node(self) -> dict[str, Any]:
        return self.site.node()

    def terminate(self, grace_s: float, port_free_s: float) -> None:
        self._stop.set()
        with self._lock:
            if not self._lost:
                with contextlib.suppress(Exception):
                    self._append(self.site.call("terminate", grace_s, port_free_s, self.offset,
                                                timeout=2 * grace_s + port_free_s + CALL_S))
            if self._log is not None:
                self._log.close()
                self._log = None
