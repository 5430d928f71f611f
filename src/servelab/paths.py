"""Where servelab keeps its state: `SERVELAB_HOME` or `~/.servelab`."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """The servelab state folder (results store, job files); created on first use."""
    root = Path(os.environ.get("SERVELAB_HOME") or Path.home() / ".servelab")
    root.mkdir(parents=True, exist_ok=True)
    return root


def default_store() -> Path:
    return home() / "results.db"


def jobs_dir() -> Path:
    d = home() / "jobs"
    d.mkdir(parents=True, exist_ok=True)
    return d
