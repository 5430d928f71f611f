"""What every deployment shares, wherever its processes run: the error a failed launch raises
(with the failing process's log tail), the `Running` interface a deployment drives (a local
process, local.py; or one on a Ray node, ray_hosts.py), and the host helpers both use."""

from __future__ import annotations

import os
import shlex
import threading
from pathlib import Path
from typing import Any, Protocol

from servelab.engines.base import ProcessPlan
from servelab.redaction import redact, redact_text


class DeployError(Exception):
    """A deployment could not be brought up; carries the failing process's log tail."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


def tail(path: Path, lines: int = 40, max_bytes: int = 16384) -> str:
    """The last lines of a log file ('' when missing), secrets redacted: tails go into errors,
    console lines and the store."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            data = f.read().decode(errors="replace")
    except OSError:
        return ""
    return redact_text("\n".join(data.splitlines()[-lines:])) or ""


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


def on_main_thread() -> bool:
    """Signal handlers can only be set on the main thread."""
    return threading.current_thread() is threading.main_thread()


def launch_line(argv: list[str]) -> bytes:
    """The `$ command` line a log starts with, secrets redacted, quoted as a shell would read it."""
    return f"$ {shlex.join(str(a) for a in redact(list(argv)))}\n".encode()

