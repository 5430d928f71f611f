"""A deployment: one or more processes (a server; or prefill + decode + router) started in order,
each with its own log, readiness probe and process group, and torn down together.

Teardown sends SIGTERM to each process group (and to any descendant that left it), SIGKILL after
a grace period, then waits until the ports are free and, where nvidia-smi exists, until the GPU
memory is back to what it was before the launch. No process outlives `stop()`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, Protocol

from servelab import lifetime
from servelab.engines.base import Engine, ProcessConfig, ProcessPlan
from servelab.engines.launcher import Launcher
from servelab.experiment.ports import free_port, wait_port_free
from servelab.jobs import pid_alive

_PR_SET_PDEATHSIG = 1


class DeployError(Exception):
    """A deployment could not be brought up; carries the failing process's log tail."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail




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


def tail(path: Path, lines: int = 40, max_bytes: int = 16384) -> str:
    """The last lines of a log file ('' when missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            data = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def descendants(pid: int) -> list[int]:
    """All live descendants of `pid` (from /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up in the parent (a dlopen in the forked child could deadlock)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL if the runner dies (Linux), so even a killed runner
    leaves no engine behind."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Running(Protocol):
    """A launched process as the deployment drives it: here (LocalProcess) or on a Ray node
    (ray_hosts.RayProcess)."""

    plan: ProcessPlan

    def poll(self) -> int | None: ...
    def lost(self) -> str | None: ...
    def tail(self, lines: int = 40) -> str: ...
    def where(self) -> str: ...
    def pids(self) -> list[int]: ...
    def node(self) -> dict[str, Any] | None: ...
    def terminate(self, grace_s: float, port_free_s: float) -> None: ...


class LocalProcess:
    """One engine process launched on this host: its own process group, a death signal tied
    to the launching thread, the lifetime watchdog, and its log file. A Ray node runs the same
    class inside its actor (experiment/ray_actor.py), so launch and teardown are one code."""

    def __init__(self, plan: ProcessPlan, proc: subprocess.Popen[bytes], log_path: Path,
                 log_file: IO[bytes]) -> None:
        self.plan, self.proc, self.log_path, self.log_file = plan, proc, log_path, log_file
        self.known: set[int] = set()  # descendants seen while it ran

    @classmethod
    def launch(cls, plan: ProcessPlan, log_path: Path, base_env: dict[str, str],
               port_free_s: float) -> LocalProcess:
        """Start `plan` once its port is free; DeployError when it cannot be started."""
        if not wait_port_free(plan.host, plan.port, port_free_s):
            raise DeployError(
                f"port {plan.port} of the {plan.role} process is still in use "
                f"after {port_free_s:.0f} s"
            )
        log_file = open(log_path, "ab")  # noqa: SIM115 (closed in terminate)
        log_file.write(f"$ {' '.join(plan.argv)}\n".encode())
        log_file.flush()
        try:
            proc = subprocess.Popen(
                plan.argv,
                env={**base_env, **plan.env, **lifetime.tag()},
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                # the death signal fires when the launching THREAD ends: only the main
                # thread lives as long as the process (the watchdog covers the rest)
                preexec_fn=_die_with_parent if on_main_thread() else None,  # noqa: PLW1509
            )
        except OSError as exc:
            log_file.close()
            raise DeployError(
                f"cannot start the {plan.role} process ({plan.argv[0]}): {exc.strerror}"
            ) from None
        lifetime.guard(proc.pid)  # kill -9 of the runner: the watchdog ends the group
        return cls(plan, proc, log_path, log_file)

    def poll(self) -> int | None:
        """The exit status, or None while it runs (descendants are recorded meanwhile)."""
        code = self.proc.poll()
        if code is None:
            self.known.update(descendants(self.proc.pid))
        return code

    def lost(self) -> str | None:
        """Why the process is gone, or None while it runs."""
        code = self.proc.poll()
        return None if code is None else f"the {self.plan.role} process exited with status {code}"

    def tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)

    def where(self) -> str:
        return str(self.log_path)

    def pids(self) -> list[int]:
        return [self.proc.pid, *descendants(self.proc.pid)]

    def node(self) -> dict[str, Any] | None:
        return None  # this host: the run's provenance names it

    def terminate(self, grace_s: float, port_free_s: float) -> None:
        """SIGTERM to the process group and every descendant, SIGKILL after `grace_s`; then
        wait (up to `port_free_s`) for its port to be free."""
        victims = set(self.known) | set(descendants(self.proc.pid))
        _signal_all(self.proc.pid, victims, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        victims |= set(descendants(self.proc.pid))
        deadline = time.monotonic() + grace_s
        while any(pid_alive(p) for p in victims) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_all(self.proc.pid, victims, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        lifetime.release(self.proc.pid)
        self.log_file.close()
        wait_port_free(self.plan.host, self.plan.port, port_free_s)


class Site:
    """Where a deployment's process runs, as planning sees it: the address it binds and its
    URLs name, and free ports there. This host by default; a Ray node (ray_hosts.py); or a
    node --check predicts, whose ports are only a layout."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.env: dict[str, str] = {}  # what the site adds to the process's environment

    def launcher(self, launcher: Launcher, engine: Engine) -> Launcher:
        """The process's launcher as it applies there (a Ray node names its own Python)."""
        return launcher

    def free_port(self, taken: set[int]) -> int:
        while (p := free_port(self.address)) in taken:
            pass
        return p

    def launch(self, plan: ProcessPlan, log_path: Path, base_env: dict[str, str],
               port_free_s: float) -> Running:
        return LocalProcess.launch(plan, log_path, base_env, port_free_s)

    def close(self) -> None:
        """Release what holds the site (a Ray actor); nothing for this host."""


class Deployment:
    """Processes of one arm, launched by `start()` and removed by `stop()` (context manager).
    Each runs where its placement says: on this host, or on a Ray node through a small actor
    (experiment/ray_hosts.py); planning, readiness and teardown are the same for both."""

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
        from servelab.experiment import ray_hosts

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


def on_main_thread() -> bool:
    """Signal handlers can only be set on the main thread."""
    import threading

    return threading.current_thread() is threading.main_thread()


def _signal_all(leader: int, others: set[int], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, sig)
    for pid in others:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
