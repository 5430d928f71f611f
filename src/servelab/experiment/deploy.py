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
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from servelab import lifetime
from servelab.engines.base import Engine, ProcessConfig, ProcessPlan
from servelab.jobs import pid_alive

_PR_SET_PDEATHSIG = 1


class DeployError(Exception):
    """A deployment could not be brought up; carries the failing process's log tail."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


def port_free(host: str, port: int) -> bool:
    """True when nothing listens on (host, port) and it can be bound."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_port_free(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not port_free(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


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


@dataclass
class _Running:
    plan: ProcessPlan
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    known: set[int] = field(default_factory=set)  # descendants seen while it ran


class Deployment:
    """Processes of one arm, launched by `start()` and removed by `stop()` (context manager)."""

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
        self.running: list[_Running] = []
        self.plans: list[ProcessPlan] = []
        self._gpu_before: list[int] | None = None
        self.warning: str | None = None  # set when teardown could not confirm a clean machine

    @property
    def url(self) -> str:
        """The endpoint the benchmark talks to: the router if any, else the only server."""
        return self.plans[-1].url

    @property
    def argvs(self) -> list[dict[str, Any]]:
        """Role, argv and env delta of every process (for provenance)."""
        return [{"role": p.role, "argv": p.argv, "env": p.env} for p in self.plans]

    def plan(self) -> list[ProcessPlan]:
        """Render commands with ports: the HTTP port, and each port the engine binds besides
        it (Engine.port_flags: SGLang's NCCL, engine-info and prefill bootstrap ports) unless
        the file sets it, all distinct, so PD and several arms fit one node. The ports of
        fixed-port processes must be free at launch."""
        plans: dict[str, ProcessPlan] = {}
        out: list[ProcessPlan] = []
        resolved_cfgs: list[ProcessConfig] = []
        taken: set[int] = {c.port for c in self.procs if c.port}
        taken |= {int(v) for c in self.procs for k, v in c.flags.items()
                  if k in self.engine.port_flags(c.role) and str(v).isdigit()}

        def fresh(host: str) -> int:
            while (p := free_port(host)) in taken:
                pass
            taken.add(p)
            return p

        for i, cfg in enumerate(self.procs):
            port = cfg.port or fresh(cfg.host)
            flags = dict(cfg.flags)
            for pf in self.engine.port_flags(cfg.role):
                if pf not in flags:
                    flags[pf] = fresh(cfg.host)
            extra = dict(cfg.extra)
            if cfg.role == "router":
                for p, pc in zip(out, resolved_cfgs, strict=False):
                    boot = pc.flags.get("disaggregation-bootstrap-port")
                    if p.role == "prefill" and boot:
                        extra[f"bootstrap_port:{p.port}"] = boot
            resolved = ProcessConfig(role=cfg.role, flags=flags, env=cfg.env, host=cfg.host,
                                     port=port, extra=extra, launcher=cfg.launcher)
            resolved_cfgs.append(resolved)
            argv = self.engine.command(resolved, self.model, plans)
            url = f"http://{cfg.host}:{port}"
            plan = ProcessPlan(
                role=cfg.role,
                argv=argv,
                env=dict(cfg.env),
                host=cfg.host,
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
        if not self.plans:
            self.plan()
        try:
            for i, plan in enumerate(self.plans):
                if not wait_port_free(plan.host, plan.port, self.port_free_s):
                    raise DeployError(
                        f"port {plan.port} of the {plan.role} process is still in use "
                        f"after {self.port_free_s:.0f} s"
                    )
                log_path = self.log_dir / f"{i}-{plan.role}.log"
                log_file = open(log_path, "ab")  # noqa: SIM115 (closed in stop)
                log_file.write(f"$ {' '.join(plan.argv)}\n".encode())
                log_file.flush()
                try:
                    proc = subprocess.Popen(
                        plan.argv,
                        env={**self.base_env, **plan.env, **lifetime.tag()},
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                        preexec_fn=_die_with_parent,  # noqa: PLW1509
                    )
                except OSError as exc:
                    log_file.close()
                    raise DeployError(
                        f"cannot start the {plan.role} process ({plan.argv[0]}): {exc.strerror}"
                    ) from None
                lifetime.guard(proc.pid)  # kill -9 of the runner: the watchdog ends the group
                self.running.append(_Running(plan, proc, log_path, log_file))
                self._wait_ready(self.running[-1], stop_check)
        except BaseException:
            self.stop()
            raise
        return self.url

    def _wait_ready(self, r: _Running, stop_check: Callable[[], None] | None) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        delay = 0.05
        while True:
            if stop_check:
                stop_check()
            code = r.proc.poll()
            if code is not None:
                raise DeployError(
                    f"the {r.plan.role} process exited with status {code} before it was "
                    f"ready (log: {r.log_path})",
                    tail(r.log_path),
                )
            if self.engine.ready(r.plan.url):
                return
            if time.monotonic() > deadline:
                raise DeployError(
                    f"the {r.plan.role} process was not ready after "
                    f"{self.ready_timeout_s:.0f} s (log: {r.log_path})",
                    tail(r.log_path),
                )
            r.known.update(descendants(r.proc.pid))
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def alive(self) -> bool:
        return bool(self.running) and all(r.proc.poll() is None for r in self.running)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(
            f"--- {r.plan.role} ({r.log_path}) ---\n{tail(r.log_path, lines)}" for r in self.running
        )

    def pids(self) -> list[int]:
        """Pids of every process and descendant of this deployment (for tests and checks)."""
        out: list[int] = []
        for r in self.running:
            out.append(r.proc.pid)
            out.extend(descendants(r.proc.pid))
        return out

    def stop(self, wait_gpu: bool = True) -> None:
        """Tear down in reverse order: SIGTERM to each process group and stray descendants,
        SIGKILL after the grace period; then wait for ports (and, with `wait_gpu`, GPU memory)
        to be free. GPU memory is read per GPU, not per process, so a deployment stopped while
        others stay up (restart 'block') must not wait for its launch-time level: the others'
        memory moves meanwhile; the runner lets only the block's first-launched one wait."""
        # Ctrl-C during teardown must not leave it half done: it is held and re-raised after.
        held: list[int] = []
        old = (
            signal.signal(signal.SIGINT, lambda sig, frame: held.append(sig))
            if on_main_thread()
            else None
        )
        try:
            for r in reversed(self.running):
                self._terminate(r)
            for r in self.running:
                wait_port_free(r.plan.host, r.plan.port, self.port_free_s)
            if wait_gpu:
                self._wait_gpu()
        finally:
            self.running = []
            if old is not None:
                signal.signal(signal.SIGINT, old)
        if held:
            raise KeyboardInterrupt

    def _terminate(self, r: _Running) -> None:
        victims = set(r.known) | set(descendants(r.proc.pid))
        _signal_all(r.proc.pid, victims, signal.SIGTERM)
        try:
            r.proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            pass
        victims |= set(descendants(r.proc.pid))
        deadline = time.monotonic() + self.grace_s
        while any(pid_alive(p) for p in victims) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_all(r.proc.pid, victims, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            r.proc.wait(timeout=10)
        lifetime.release(r.proc.pid)
        r.log_file.close()

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
