"""Long jobs (experiments, tuning) that report progress to `servelab status`, and `--detach`.

A job writes its state to `$SERVELAB_HOME/jobs/<name>.json` atomically at each step; `status`
reads those files. A job whose pid is gone without a final state is shown as 'dead'.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from servelab import atomic, paths
from servelab.errors import UserError


@dataclass
class JobState:
    name: str
    kind: str                      # 'experiment' or 'tune'
    pid: int
    started: float
    total: int                     # units of work (runs, tuning units)
    done: int = 0
    failed: int = 0
    current: str = ""              # e.g. "arm mtp, c=8, rep 2"
    state: str = "running"         # running | finished | failed | interrupted
    log: str | None = None         # path of the detached job's log
    updated: float = field(default_factory=time.time)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def eta_s(self) -> float | None:
        """Remaining seconds at the mean pace so far; None before the first unit is done."""
        if self.done <= 0 or self.total <= self.done:
            return None if self.total > self.done else 0.0
        pace = (self.updated - self.started) / self.done
        return pace * (self.total - self.done)


def _path(name: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return paths.jobs_dir() / f"{safe}.json"


class Job:
    """Progress reporter for one long job."""

    def __init__(self, name: str, kind: str, total: int, log: str | None = None) -> None:
        self.state = JobState(name=name, kind=kind, pid=os.getpid(), started=time.time(), total=total, log=log)
        self._write()

    def update(self, *, done: int | None = None, failed: int | None = None, current: str | None = None,
               **extra: Any) -> None:
        if done is not None:
            self.state.done = done
        if failed is not None:
            self.state.failed = failed
        if current is not None:
            self.state.current = current
        self.state.extra.update(extra)
        self.state.updated = time.time()
        self._write()

    def finish(self, state: str = "finished") -> None:
        self.state.state = state
        self.state.updated = time.time()
        self._write()

    def _write(self) -> None:
        atomic.write_bytes(_path(self.state.name), orjson.dumps(asdict(self.state)))


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists and has not exited: a zombie (exited, not yet reaped by its
    parent) counts as dead; a process of another user that we may not signal counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


_alive = pid_alive  # the old private name, still used by tests/tune/test_job.py


def read_all(name: str | None = None) -> list[JobState]:
    """All known jobs (newest first), or the one named; a running job whose process is gone is 'dead'."""
    out: list[JobState] = []
    for p in sorted(paths.jobs_dir().glob("*.json")):
        try:
            st = JobState(**orjson.loads(p.read_bytes()))
        except (orjson.JSONDecodeError, TypeError):
            continue
        if name and st.name != name:
            continue
        if st.state == "running" and not pid_alive(st.pid):
            st.state = "dead"
        out.append(st)
    return sorted(out, key=lambda s: s.started, reverse=True)


def log_path(name: str) -> Path:
    """Where `detach` writes the output of job `name`."""
    return paths.jobs_dir() / f"{name}.log"


def detach(argv: list[str], name: str) -> tuple[int, Path]:
    """Re-run this servelab command line (without --detach) in a new session in the background;
    returns its pid and log path. A job of that name that is still running is refused: a second
    copy would race the first over the same store rows and files."""
    for st in read_all(name):
        if st.state == "running":
            raise UserError(f"job '{name}' is already running (pid {st.pid}); `servelab status "
                            f"{name}` shows its progress")
    log = log_path(name)
    args = [a for a in argv if a != "--detach"]
    with atomic.open_append(log) as f:       # 0600, never through a link
        proc = subprocess.Popen(
            [sys.executable, "-m", "servelab", *args],
            stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    return proc.pid, log
