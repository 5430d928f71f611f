"""Process lifetime: engines, workers and their children die with the servelab process that
started them, however it ends (return, exception, Ctrl-C, SIGTERM, or kill -9).

Two mechanisms, because each alone leaves a gap:

- `die_with_parent` (Linux PR_SET_PDEATHSIG): the direct child gets SIGKILL the moment its
  parent dies. It covers the child only: a multi-process engine's GPU workers (its children)
  were orphaned when `servelab run` was killed with -9, and tune workers lived on for 6-19 s.
- A watchdog (`guard`): one small process per servelab process, in its own session, started on
  the first `guard(pid)`. It is told each child to watch through a pipe, records every
  descendant of those children twice a second (also those that left the process group with
  setsid), and finds the rest by a token in their environment (`tag()`, which a child passes on
  to everything it starts unless it clears its environment: this catches a grandchild started
  a moment before the death, between two records), and when the pipe reaches end-of-file, which is the instant its parent dies, by any
  means, it sends SIGTERM to the children's process groups and every recorded descendant, then
  SIGKILL after a grace period. A child torn down normally is `release`d first. Process ids are
  checked against their start time, so a reused id is never signalled.

`python -m servelab.lifetime` is the watchdog's entry point; nothing else runs it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1
GRACE_S = 3.0
SCAN_S = 0.5
TOKEN_VAR = "SERVELAB_LIFETIME_TOKEN"

try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the watchdog alone
    _PRCTL = None


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL) -> None:
    """In a child (a Popen preexec_fn, or the first thing a worker does): get `sig` when the
    parent dies. With `parent_pid`, exit at once if the parent is already gone (it may die
    between the fork and this call)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, sig)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def run_tied(parent_pid: int, fn: Callable[..., Any], *args: Any) -> Any:
    """Target for multiprocessing children: die with `parent_pid`, then run `fn(*args)`."""
    die_with_parent(parent_pid)
    return fn(*args)


# ---- the watchdog, seen from the process it guards ----------------------------------------------

_lock = threading.Lock()
_watchdog: subprocess.Popen[bytes] | None = None
_owner_pid: int | None = None
_token: str | None = None


def tag() -> dict[str, str]:
    """Environment to give a guarded child: its descendants inherit it, and the watchdog ends
    every process that carries it when this process dies."""
    global _token
    if _token is None or not _token.startswith(f"{os.getpid()}."):
        _token = f"{os.getpid()}.{uuid.uuid4().hex}"
    return {TOKEN_VAR: _token}


def _send(line: str) -> None:
    global _watchdog, _owner_pid
    with _lock:
        if _watchdog is None or _owner_pid != os.getpid() or _watchdog.poll() is not None:
            _watchdog = subprocess.Popen(
                [sys.executable, "-m", "servelab.lifetime", str(os.getpid()),
                 tag()[TOKEN_VAR]],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, close_fds=True,
            )
            _owner_pid = os.getpid()
        try:
            assert _watchdog.stdin is not None
            _watchdog.stdin.write(line.encode() + b"\n")
            _watchdog.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the watchdog is gone; the death signal still covers the direct child


def guard(pid: int, group: bool = True) -> None:
    """Watch child `pid` (its process group too when `group`): if this process dies before
    `release(pid)`, the watchdog ends the child and all its descendants."""
    _send(f"+{pid} {1 if group else 0}")


def release(pid: int) -> None:
    """The child `pid` was torn down (or is about to be, by its owner): stop watching it."""
    if _watchdog is not None and _owner_pid == os.getpid():
        _send(f"-{pid}")


def watchdog_pid() -> int | None:
    """The watchdog's pid in this process, if one was started (tests)."""
    return _watchdog.pid if _watchdog is not None and _owner_pid == os.getpid() else None


# ---- the watchdog itself ------------------------------------------------------------------------

def _start_time(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out.setdefault(ppid, []).append(int(d.name))
    return out


def _carrying(token: str) -> dict[int, int]:
    """Processes whose environment holds the token -> their start times."""
    needle = f"{TOKEN_VAR}={token}".encode()
    out: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            st = _start_time(int(d.name))
            if st is not None:
                out[int(d.name)] = st
    return out


class _Watch:
    def __init__(self, token: str | None = None) -> None:
        self.roots: dict[int, bool] = {}  # pid -> kill its process group too
        self.known: dict[int, int] = {}  # every pid seen under a root -> its start time
        self.token = token

    def scan(self) -> None:
        if not self.roots:
            return
        kids = _children_map()
        todo = list(self.roots)
        while todo:
            p = todo.pop()
            st = _start_time(p)
            if st is not None:
                self.known.setdefault(p, st)
            todo.extend(kids.get(p, ()))

    def forget(self, pid: int) -> None:
        self.roots.pop(pid, None)
        self.known.pop(pid, None)
        # descendants recorded under it die with it at teardown; drop those no longer alive
        self.known = {p: s for p, s in self.known.items() if _start_time(p) == s}

    def _signal(self, sig: int) -> None:
        for root, group in self.roots.items():
            if group:  # even when the leader is gone: Linux keeps its id while the group lives
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(root, sig)
        for p, st in self.known.items():
            if _start_time(p) == st:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, sig)

    def kill_all(self) -> None:
        self.scan()
        if self.token:
            self.known.update(_carrying(self.token))
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(
                _start_time(p) == s for p, s in self.known.items()):
            time.sleep(0.05)
        self._signal(signal.SIGKILL)


def _serve(owner: int, token: str | None) -> None:
    """Read watch/release lines from stdin until EOF, then end whatever is still watched."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the owner, not for us
    die_with_parent(owner, signal.SIGUSR1)  # a second route to the same end
    signal.signal(signal.SIGUSR1, lambda *_: None)
    w = _Watch(token)
    fd = sys.stdin.fileno()
    buf = b""
    while True:
        try:
            ready, _, _ = select.select([fd], [], [], SCAN_S)
        except InterruptedError:
            ready = []
        if not ready:
            if os.getppid() != owner:
                break
            w.scan()
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            text = line.decode(errors="replace").strip()
            if text.startswith("+"):
                pid_s, _, group = text[1:].partition(" ")
                if pid_s.isdigit():
                    w.roots[int(pid_s)] = group != "0"
                    w.scan()
            elif text.startswith("-") and text[1:].isdigit():
                w.forget(int(text[1:]))
    w.kill_all()


if __name__ == "__main__":
    _serve(int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid(),
           sys.argv[2] if len(sys.argv) > 2 else None)
