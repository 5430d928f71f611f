"""Start `python -m servelab <verb> ...` as a real subprocess on a free loopback port and wait
for its "ready" line: the servers the mini/PD/router tests talk to."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*args: str) -> tuple[subprocess.Popen, int]:
    """`servelab ARGS --port P` with stdout+stderr piped; (process, P)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "servelab", *args, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, port


def wait_ready(proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    line = ""
    while time.time() < deadline:
        line = proc.stdout.readline()
        if "ready" in line or not line:
            break
    assert "ready" in line, f"did not start: {line!r}"


def one_slot_tiny() -> Iterator[str]:
    """The embedded engine (`tiny`, CPU) with one slot, so a burst of requests queues: yields
    its URL, and kills it after (the body of a module-scoped fixture: `yield from`)."""
    proc, port = start("serve", "--config", "tiny", "--device", "cpu",
                       "--max-running-requests", "1", "--context-length", "256")
    wait_ready(proc, 120)
    yield f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()
