"""A deployment: one or more processes (a server; or prefill + decode + router) started in order,
each with its own log, readiness probe and process group, and torn down together.

Teardown stops each process (local.py: SIGTERM to its process group and stray descendants,
SIGKILL after a grace period, its port free again) and then waits, where nvidia-smi exists,
until the GPU memory is back to what it was before the launch. No process outlives `stop()`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from servelab.engines.base import Engine, ProcessConfig, ProcessPlan
from servelab.experiment.deploy import ray_hosts
from servelab.experiment.deploy.base import DeployError, Running, on_main_thread
from servelab.experiment.deploy.local import Site


def gpu_memory_used_mib() -> list[int] | None:
    """Used memory per GPU from nvidia-smi; None where there is none."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return [int(x) for x in out.split()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


class Deployment:
    """Processes of one arm, launched by `start()` and removed by `stop()` (context manager).
    Each runs where its placement says: on this host, or on a Ray node through a small actor
    (ray_hosts.py); planning, readiness and teardown are the same for both."""

    def __init__(
        self,
        engine: Engine,
        model: str,
        procs: list[ProcessConfig],
        log_dir: Path,
        *,
        ready_timeout_s: float = 900.0,
        grace_s: float = 30.0,
        port_free_s: float = 60.0,
        gpu_free_s: float = 120.0,
        base_env: dict[str, str] | None = None,
    ) -> None:
        self.engine, self.model, self.procs = engine, model, procs
        self.log_dir = Path(log_dir)
        self.ready_timeout_s, self.grace_s = ready_timeout_s, grace_s
        self.port_free_s, self.gpu_free_s = port_free_s, gpu_free_s
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.running: list[Running] = []
        self.plans: list[ProcessPlan] = []
        self.sites: list[Site] = []
        self._gpu_before: list[int] | None = None
        self.warning: str | None = None  # set when teardown could not confirm a clean machine

    @property
    def url(self) -> str:
        """The endpoint the benchmark talks to: the router if any, else the only server."""
        return self.plans[-1].url

    @property
    def argvs(self) -> list[dict[str, Any]]:
        """Role, argv and env delta of every process, and the Ray node of those placed on one
        (node id and IP, GPUs; for provenance)."""
        nodes = [r.node() for r in self.running] + [None] * len(self.plans)
        return [{"role": p.role, "argv": p.argv, "env": p.env, **({"node": n} if n else {})}
                for p, n in zip(self.plans, nodes, strict=False)]

    def _place(self) -> list[Site]:
        """A site per process: this host, or a Ray node with an actor on it (DeployError when
        the cluster cannot place one)."""
        if not any(c.placement.ray for c in self.procs):
            return [Site(c.host) for c in self.procs]
        return ray_hosts.place(self.procs, self.ready_timeout_s)

    def plan(self, sites: list[Site] | None = None) -> list[ProcessPlan]:
        """Render commands with ports: the HTTP port, and each port the engine binds besides
        it (Engine.port_flags: SGLang's NCCL, engine-info and prefill bootstrap ports) unless
        the file sets it, all distinct, so PD and several arms fit one node. Ports are free
        where the process runs (`sites`: this host by default; a Ray node's actor finds its
        own), and the address the process binds and its URL names is that site's. The ports
        of fixed-port processes must be free at launch."""
        sites = sites or [Site(c.host) for c in self.procs]
        self.sites = sites
        plans: dict[str, ProcessPlan] = {}
        out: list[ProcessPlan] = []
        resolved_cfgs: list[ProcessConfig] = []
        taken: set[int] = {c.port for c in self.procs if c.port}
        taken |= {int(v) for c in self.procs for k, v in c.flags.items()
                  if k in self.engine.port_flags(c.role) and str(v).isdigit()}

        def fresh(site: Site) -> int:
            p = site.free_port(taken)
            taken.add(p)
            return p

        for i, (cfg, site) in enumerate(zip(self.procs, sites, strict=True)):
            port = cfg.port or fresh(site)
            flags = dict(cfg.flags)
            for pf in self.engine.port_flags(cfg.role):
                if pf not in flags:
                    flags[pf] = fresh(site)
            extra = dict(cfg.extra)
            if cfg.role == "router":
                for p, pc in zip(out, resolved_cfgs, strict=False):
                    boot = pc.flags.get("disaggregation-bootstrap-port")
                    if p.role == "prefill" and boot:
                        extra[f"bootstrap_port:{p.port}"] = boot
            resolved = replace(cfg, flags=flags, host=site.address, port=port, extra=extra,
                               launcher=site.launcher(cfg.launcher, self.engine))
            resolved_cfgs.append(resolved)
            argv = self.engine.command(resolved, self.model, plans)
            url = f"http://{site.address}:{port}"
            plan = ProcessPlan(
                role=cfg.role,
                argv=argv,
                env={**cfg.env, **site.env},
                host=site.address,
                port=port,
                health_url=url + self.engine.health_path,
                url=url,
            )
            plans[f"{cfg.role}{i}"] = plan
            out.append(plan)
        self.plans = out
        return out

    def start(self, stop_check: Callable[[], None] | None = None) -> str:
        """Launch every process in order, each ready before the next; returns the endpoint URL.
        On failure everything started is stopped and DeployError carries the log tail."""
        self._gpu_before = gpu_memory_used_mib()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            if not self.plans or len(self.sites) != len(self.plans):
                self.plan(self._place())
            for i, (plan, site) in enumerate(zip(self.plans, self.sites, strict=True)):
                log_path = self.log_dir / f"{i}-{plan.role}.log"
                self.running.append(site.launch(plan, log_path, self.base_env, self.port_free_s))
                self._wait_ready(self.running[-1], stop_check)
        except BaseException:
            self.stop()
            raise
        return self.url

    def _wait_ready(self, r: Running, stop_check: Callable[[], None] | None) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        delay = 0.05
        while True:
            if stop_check:
                stop_check()
            if r.poll() is not None:
                raise DeployError(
                    f"{r.lost()} before it was ready (log: {r.where()})", r.tail()
                )
            if self.engine.ready(r.plan.url):
                return
            if time.monotonic() > deadline:
                raise DeployError(
                    f"the {r.plan.role} process was not ready after "
                    f"{self.ready_timeout_s:.0f} s (log: {r.where()})",
                    r.tail(),
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def alive(self) -> bool:
        return bool(self.running) and self.lost() is None

    def lost(self) -> str | None:
        """Why the deployment is no longer whole (a process exited, a Ray node died), or None
        while every process runs."""
        if not self.running:
            return "the deployment is not running"
        for r in self.running:
            why = r.lost()
            if why:
                return why
        return None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(f"--- {r.plan.role} ({r.where()}) ---\n{r.tail(lines)}"
                         for r in self.running)

    def pids(self) -> list[int]:
        """Pids of every process and descendant of this deployment on this host (for tests
        and checks; a Ray node's are its own)."""
        return [pid for r in self.running for pid in r.pids()]

    def stop(self, wait_gpu: bool = True) -> None:
        """Tear down in reverse order: SIGTERM to each process group and stray descendants,
        SIGKILL after the grace period, each port free again; then (with `wait_gpu`) wait
        for the GPU memory. GPU memory is read per GPU, not per process, so a deployment
        stopped while others stay up (restart 'block') must not wait for its launch-time
        level: the others' memory moves meanwhile; the runner lets only the block's
        first-launched one wait."""
        # Ctrl-C during teardown must not leave it half done: it is held and re-raised after.
        held: list[int] = []
        old = (
            signal.signal(signal.SIGINT, lambda sig, frame: held.append(sig))
            if on_main_thread()
            else None
        )
        try:
            for r in reversed(self.running):
                r.terminate(self.grace_s, self.port_free_s)
            for site in self.sites:
                site.close()
            if any(c.placement.ray for c in self.procs):  # its actors are gone: place anew
                self.sites, self.plans = [], []
            if wait_gpu:
                self._wait_gpu()
        finally:
            self.running = []
            if old is not None:
                signal.signal(signal.SIGINT, old)
        if held:
            raise KeyboardInterrupt

    def _wait_gpu(self) -> None:
        """Wait until every GPU's used memory is within 512 MiB of its level before the launch;
        after `gpu_free_s` give up and leave the reason in `self.warning`."""
        if self._gpu_before is None:
            return
        deadline = time.monotonic() + self.gpu_free_s
        while True:
            now = gpu_memory_used_mib()
            if now is None or all(
                n <= b + 512 for n, b in zip(now, self._gpu_before, strict=False)
            ):
                return
            if time.monotonic() > deadline:
                self.warning = (
                    f"GPU memory still in use {self.gpu_free_s:.0f} s after teardown "
                    f"(MiB now {now}, before launch {self._gpu_before})"
                )
                return
            time.sleep(1.0)

    def __enter__(self) -> Deployment:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
