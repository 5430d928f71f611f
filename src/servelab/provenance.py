"""Provenance attached to every result: who measured what, where, with which software.

Secrets never reach the store: `collect` applies servelab.redaction's policy, and the store
applies it again to whatever provenance it is given.
"""

from __future__ import annotations

import functools
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from servelab import __version__
from servelab.redaction import redact


@functools.cache
def git_sha() -> str | None:
    """The servelab checkout's commit (with '-dirty' when modified), or None outside a checkout."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("-dirty" if dirty else "")) or None


@functools.cache
def gpus() -> list[dict[str, str]] | None:
    """GPU name, driver and memory from nvidia-smi; None where there is none."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line.strip()]
    return [{"name": r[0], "driver": r[1], "memory": r[2]} for r in rows if len(r) >= 3] or None


def collect(**extra: Any) -> dict[str, Any]:
    """The provenance of a measurement made now; `extra` adds (e.g. server_info, workload seed)."""
    prov: dict[str, Any] = {
        "servelab_version": __version__,
        "git_sha": git_sha(),
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "time_unix": time.time(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpus": gpus(),
    }
    prov.update(extra)
    return redact(prov)
