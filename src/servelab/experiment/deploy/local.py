"""Engine processes on this host: each in its own process group, with a death signal tied to
the launching thread, the lifetime watchdog and its own log file; and `Site`, where planning
finds the address a process binds and free ports for it (this host; ray_hosts.py's RaySite is
a Ray node). A Ray node runs the same LocalProcess inside its actor (ray_actor.py), so launch
and teardown are one code.

Teardown sends SIGTERM to the process group (and to any descendant that left it), SIGKILL
after a grace period, then waits until the port is free.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from servelab import atomic, lifetime
from servelab.engines.base import Engine, ProcessPlan
from servelab.engines.launcher import Launcher
from servelab.experiment.deploy.base import (
    DeployError,
    Running,
    descendants,
    launch_line,
    on_main_thread,
    tail,
)
from servelab.experiment.deploy.ports import free_port, wait_port_free
from servelab.jobs import pid_alive

_PR_SET_PDEATHSIG = 1


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


class LocalProcess:
    """One engine process launched on this host: its own process group, a death signal tied
    to the launching thread, the lifetime watchdog, and its log file. A Ray node runs the same
    class inside its actor (ray_actor.py), so launch and teardown are one code."""

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
        log_file = atomic.open_append(log_path)  # 0600, no link; closed in terminate
        log_file.write(launch_line(plan.argv))
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


def _signal_all(leader: int, others: set[int], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, sig)
    for pid in others:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
