"""The small Ray actor that runs one engine process on its node.

One actor per engine process, created by the runner (its driver) with the process's asks
(deploy/ray_hosts.py). On its node it finds free ports, launches the command exactly as a
local deployment does (deploy/local.py LocalProcess: own process group, death signal,
lifetime watchdog, log file), reports its status and log, and tears the engine down. The
actor is not detached: Ray ends it when the driver ends, however it ends (kill -9 included),
and the engine ends with its actor (death signal and watchdog). The node's log file is
temporary: the driver copies it into the experiment's log folder as it grows.

Ray is imported only inside functions here, in ray_hosts.py and ray_nodes.py: this module is
importable without it.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from servelab import provenance
from servelab.engines.base import ProcessPlan
from servelab.experiment.deploy.base import DeployError, on_main_thread
from servelab.experiment.deploy.local import LocalProcess, Site

MAX_READ = 1 << 20  # bytes of log per call: a chatty engine is copied in pieces


class EngineHost:
    """Runs one engine process on the node Ray placed this actor on (methods are Ray calls)."""

    def __init__(self) -> None:
        self.proc: LocalProcess | None = None
        self.dir = Path(tempfile.mkdtemp(prefix="servelab-engine-"))
        self.log_path = self.dir / "engine.log"

    def where(self) -> dict[str, Any]:
        """The node this actor runs on: Ray's node id and IP, the GPUs Ray gave it (ids) and
        the node's GPUs (nvidia-smi there), the host name, and the Python running servelab."""
        import ray

        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "gpus": [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])],
            "node_gpus": provenance.gpus(),
            "ray_version": ray.__version__,
            "python": sys.executable,
            "actor_pid": os.getpid(),
            "main_thread": on_main_thread(),
        }

    def free_port(self, address: str, taken: list[int]) -> int:
        """A port free on this node, not in `taken`."""
        return Site(address).free_port(set(taken))

    def launch(self, plan: ProcessPlan, port_free_s: float) -> dict[str, Any]:
        """Start the process; {"pid": ...} or {"error": ...} (a DeployError does not cross
        Ray's boundary with its fields)."""
        try:
            self.proc = LocalProcess.launch(plan, self.log_path, dict(os.environ), port_free_s)
        except DeployError as exc:
            return {"error": str(exc)}
        return {"pid": self.proc.proc.pid}

    def poll(self) -> int | None:
        """The exit status, or None while the process runs."""
        return None if self.proc is None else self.proc.poll()

    def read(self, offset: int) -> bytes:
        """The log from byte `offset` on (at most MAX_READ bytes)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read(MAX_READ)
        except OSError:
            return b""

    def pids(self) -> list[int]:
        return [] if self.proc is None else self.proc.pids()

    def terminate(self, grace_s: float, port_free_s: float, offset: int) -> bytes:
        """Tear the process down (SIGTERM, SIGKILL after `grace_s`, port free again); returns
        the log from `offset` on, then removes the node's copy."""
        if self.proc is not None:
            self.proc.terminate(grace_s, port_free_s)
        rest = b""
        while chunk := self.read(offset + len(rest)):
            rest += chunk
        shutil.rmtree(self.dir, ignore_errors=True)
        return rest
