"""Ports for the processes servelab launches: free now, and below the kernel's ephemeral range.

A port picked by binding port 0 comes from the ephemeral range (Linux: 32768-60999 by default,
/proc/sys/net/ipv4/ip_local_port_range), the range the kernel also hands to every outgoing
connection. Between our choice and the engine's bind, any connection on the node (a client,
NCCL, a download) may take it, and the engine then fails to start with "address in use". Ports
below that range are only ever taken by a listener that asks for them: SGLang picks its own
NCCL port there for the same reason. So an engine's HTTP, NCCL, bootstrap and RPC ports come
from [10000, start of the ephemeral range), falling back to bind(0) when that range is small or
unknown (e.g. not Linux)."""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

LOWEST = 10000
RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_start(path: Path = RANGE_FILE) -> int | None:
    """The first port of the kernel's ephemeral range, None where it cannot be read."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def port_free(host: str, port: int) -> bool:
    """True when nothing listens on (host, port) and it can be bound."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", tries: int = 64) -> int:
    """A port free now on `host`, below the ephemeral range when there is room (module doc)."""
    top = ephemeral_start()
    if top is not None and top - LOWEST >= 1000:
        for _ in range(tries):
            p = random.randrange(LOWEST, top)
            if port_free(host, p):
                return p
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_port_free(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not port_free(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
