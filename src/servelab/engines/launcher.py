"""Where an engine lives and how its processes are started: the engine's own interpreter, its
own executable, or a container command prefix. servelab never assumes its own venv for an
engine (real deployments keep SGLang or vLLM in their own venv or image).

A process is located by three things, all optional:
  python      the engine's interpreter, e.g. /opt/sglang/.venv/bin/python: module engines run
              as `python -m sglang.launch_server ...`
  executable  the engine's console command, e.g. /opt/vllm/.venv/bin/vllm: `vllm serve ...`
  container   a prefix every command gets, e.g. ["docker", "exec", "-i", "sgl"]
With none given, module engines run with `python3` and console engines with their command,
both found on PATH where the process starts. The same prefix runs the engine's own argument
parser at pre-flight (engines/parser_probe.py), so a plan is judged where it will run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Entry:
    """How an engine names one process's program: a Python module (`python -m module`) or a
    console command with a subcommand (`vllm serve`)."""

    module: str | None = None
    console: str | None = None
    subcommand: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Launcher:
    """Where one process's engine lives (see the module docstring)."""

    python: str | None = None
    executable: str | None = None
    container: tuple[str, ...] = ()

    def argv(self, entry: Entry) -> list[str]:
        """The program part of a command line, before the engine's arguments."""
        if entry.module is not None and (self.python or not entry.console):
            return [*self.container, self.python or "python3", "-m", entry.module]
        if entry.console is not None:
            return [*self.container, self.executable or entry.console, *entry.subcommand]
        raise ValueError("an entry names a module or a console command")

    def interpreter(self) -> list[str] | None:
        """The command that runs Python where the engine lives (for its parser): the named
        interpreter, else the one in the executable's '#!' line, else `python3` on PATH."""
        if self.python:
            return [*self.container, self.python]
        if self.executable and not self.container:
            try:
                first = Path(self.executable).read_text(errors="replace").splitlines()[0]
            except (OSError, IndexError):
                first = ""
            if first.startswith("#!") and "python" in first:
                return first[2:].split()
        return [*self.container, "python3"]

    def describe(self) -> str:
        parts = []
        if self.container:
            parts.append("container " + " ".join(self.container))
        if self.python:
            parts.append(f"python {self.python}")
        if self.executable:
            parts.append(f"executable {self.executable}")
        return ", ".join(parts) or "PATH (python3 / the engine's command)"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one process runs: on this host (`local`), or on a node of a Ray cluster chosen by
    what the process asks for (experiment/deploy/ray_hosts.py starts one small actor there that
    launches it). The asks are Ray's own: CPUs and GPUs, custom resources (`node:prefill`),
    a node IP (Ray's `node:<ip>` resource) and node labels (Ray's label selector)."""

    kind: str = "local"  # "local" | "ray"
    address: str | None = None  # ray.init(address=...): "auto", "ray://h:p", "h:p"; None: as Ray
    num_cpus: float = 0.0  # 0: the actor reserves no CPU (the engine's own needs are the asks)
    num_gpus: float = 0.0
    resources: tuple[tuple[str, float], ...] = ()
    node_ip: str | None = None
    node_labels: tuple[tuple[str, str], ...] = ()

    @property
    def ray(self) -> bool:
        return self.kind == "ray"

    def asks(self) -> dict[str, float]:
        """What the process needs of a node, in Ray's resource names."""
        out: dict[str, float] = dict(self.resources)
        if self.num_cpus:
            out["CPU"] = self.num_cpus
        if self.num_gpus:
            out["GPU"] = self.num_gpus
        if self.node_ip:
            out[f"node:{self.node_ip}"] = 0.001  # Ray's idiom for "on the node with this IP"
        return out

    def describe(self) -> str:
        """The asks as one short phrase (errors, --check)."""
        parts = [f"{k}={v:g}" for k, v in self.asks().items()]
        parts += [f"label {k}={v}" for k, v in self.node_labels]
        return ", ".join(parts) or "nothing in particular"
