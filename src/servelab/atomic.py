"""Atomic file writes (a temp file in the same folder, fsync, then rename over the target:
the rename replaces a link, never writes through it) and appends that refuse links."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a torn one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode())


def open_append(path: str | Path, private: bool = True) -> IO[bytes]:
    """`path` opened for appending, never through a link (O_NOFOLLOW: a planted link is an
    error, not a write elsewhere); created 0600 when `private` (logs may hold what an engine
    prints about itself), else 0644."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    return os.fdopen(os.open(path, flags, 0o600 if private else 0o644), "ab")
