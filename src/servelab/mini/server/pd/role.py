"""A server's role in prefill/decode disaggregation, as the HTTP handlers see it (server/).

`--disaggregation-mode null` (default): an ordinary server; the bootstrap fields of a body are
ignored. `prefill`: every generation request must carry SGLang's `bootstrap_room` (the router
adds it); the engine prefills, the KV goes to the bootstrap server (bootstrap.py) under that
room, and the answer ends after the first token. `decode`: the request also carries
`bootstrap_host` / `bootstrap_port`; the server fetches the room's KV first (no slot is held
while waiting), checks it fits this model and prompt, then submits the request with it. A
transfer that fails fails that request alone (502, or 504 when the KV never came), with the
reason; the server keeps serving. A decode server fetches only from the hosts its allow-list
names (allow.py: a client's `bootstrap_host` outside it is a 400, and no request goes there),
and at most so many fetches at once per prefill (fetch_queue.py).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from servelab.mini.engine.kv_handoff import KVHandoff, TransferError
from servelab.mini.server.args import DEFAULT_BOOTSTRAP_PORT
from servelab.mini.server.pd.allow import BootstrapHosts
from servelab.mini.server.pd.bootstrap import BootstrapServer, fetch, host_port
from servelab.mini.server.pd.fetch_queue import (
    DEFAULT_PER_CLIENT,
    DEFAULT_PER_PREFILL,
    FetchQueue,
)
from servelab.mini.server.pd.wire import ROOM_MAX, TransferStats
from servelab.mini.server.protocol import ApiError

if TYPE_CHECKING:
    from servelab.mini.engine.engine import Engine


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """SGLang's three fields the PD router adds to a request body."""

    host: str | None
    port: int
    room: int


def bootstrap_of(body: dict) -> Bootstrap | None:
    """The body's bootstrap fields (None when it has no `bootstrap_room`); 400 when malformed."""
    room = body.get("bootstrap_room")
    if room is None:
        return None
    host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
    if isinstance(room, list) or isinstance(host, list) or isinstance(port, list):
        raise ApiError(400, "batched bootstrap fields (lists) are not supported: one prompt per "
                            "request", param="bootstrap_room")
    if type(room) is not int or not 0 <= room <= ROOM_MAX:
        raise ApiError(400, f"'bootstrap_room' must be an integer in [0, 2^64), got {room!r}",
                       param="bootstrap_room")
    if port is None:
        port = DEFAULT_BOOTSTRAP_PORT  # the router sends null for a prefill named without one
    if type(port) is not int or not 1 <= port <= 65535:
        raise ApiError(400, f"'bootstrap_port' must be a port number, got {port!r}",
                       param="bootstrap_port")
    if host is not None:
        host = _host(host)
    return Bootstrap(host, port, room)


_HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_-]{1,63})*\.?")


def _host(host: object) -> str:
    """A host name or IP address (IPv6 bare or in brackets); never text that would change the
    URL the decode server fetches from (a '/', '@', '#' or a port)."""
    if isinstance(host, str) and host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if isinstance(host, str):
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            if _HOSTNAME.fullmatch(host) and len(host) <= 253:
                return host
    raise ApiError(400, f"'bootstrap_host' must be a host name or IP address, got {host!r}",
                   param="bootstrap_host")


class PD:
    """The disaggregation role of one server: what a generation request needs before it is
    submitted to the engine, and what happens when it fails."""

    def __init__(self, engine: Engine, mode: str, host: str, bootstrap_port: int,
                 waiting_timeout_s: float, allowed: BootstrapHosts | None = None,
                 fetch_per_prefill: int = DEFAULT_PER_PREFILL,
                 fetch_per_client: int = DEFAULT_PER_CLIENT) -> None:
        self.engine, self.mode = engine, mode
        self.waiting_timeout_s = waiting_timeout_s
        self.stats: TransferStats | None = None
        self.bootstrap: BootstrapServer | None = None
        self.queue: FetchQueue | None = None
        self.allowed = allowed
        self._session = None
        self.max_handoff_bytes = 0  # (a server of no PD role receives no handoff)
        # the largest handoff one request can make: every layer (+ MTP) of a full context, plus
        # 1 MiB for the header and the sampler state. A decode server reads no more than that;
        # a prefill server holds at most a few batches of them for decode sides that lag.
        if mode != "null":
            cfg = engine.cfg
            self.max_handoff_bytes = (
                (cfg.n_layers + 1) * engine.args.context_length * (cfg.kv_dim + cfg.index_dim)
                * engine.cache.kv[0].element_size() + (1 << 20))
        if mode == "prefill":
            self.stats = TransferStats("sent")
            self.bootstrap = BootstrapServer(
                host, bootstrap_port, self.stats,
                max_pending_bytes=4 * engine.args.max_running_requests * self.max_handoff_bytes)
        elif mode == "decode":
            self.stats = TransferStats("received")
            self.queue = FetchQueue(fetch_per_prefill, self.stats, fetch_per_client)
            if self.allowed is None:
                self.allowed = BootstrapHosts.of([])

    def start(self) -> None:
        if self.bootstrap is not None:
            self.bootstrap.start()

    def stop(self) -> None:
        """Close the bootstrap port (the server is stopping)."""
        if self.bootstrap is not None:
            self.bootstrap.stop()

    def room(self, body: dict) -> Bootstrap | None:
        """The request's bootstrap fields; a prefill or decode server refuses a request
        without them (it cannot serve one alone)."""
        if self.mode == "null":
            return None
        boot = bootstrap_of(body)
        if boot is None:
            raise ApiError(400, f"this server runs --disaggregation-mode {self.mode}: send "
                                "requests through a PD router (no 'bootstrap_room' in the body)",
                           param="bootstrap_room")
        if self.mode == "decode" and boot.host is None:
            raise ApiError(400, "'bootstrap_host' is missing: the decode server cannot tell "
                                "where the prefill server is", param="bootstrap_host")
        if self.mode == "decode" and not self.allowed.allows(boot.host):
            raise ApiError(400, f"'bootstrap_host' {boot.host} is not a host this decode server "
                                "fetches KV from (loopback, this machine's addresses and "
                                "--disaggregation-allowed-bootstrap-hosts); no request was "
                                "made there", param="bootstrap_host")
        return boot

    def failed(self, boot: Bootstrap | None, message: str) -> None:
        """A prefill that fails leaves its reason in the room (its decode side fails at once)."""
        if boot is not None and self.bootstrap is not None:
            self.bootstrap.put_error(boot.room, message)

    async def submit_kwargs(self, boot: Bootstrap | None, prompt: list[int],
                            client: str = "") -> dict[str, Any]:
        """Keyword arguments of Engine.submit for this request (empty on an ordinary server);
        on a decode server this waits for the room's KV (`client`: the peer, whose turn in
        the fetch queue this is)."""
        if boot is None:
            return {}
        if self.mode == "prefill":
            return {"room": boot.room, "export": self.bootstrap.put}
        handoff = await self._fetch(boot, prompt, client)
        return {"room": boot.room, "handoff": handoff}

    async def _fetch(self, boot: Bootstrap, prompt: list[int], client: str) -> KVHandoff:
        if self._session is None:  # no pool limit: the fetch queue limits per prefill
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        try:
            async with self.queue.slot(host_port(boot.host, boot.port), client):
                handoff = await fetch(self._session, boot.host, boot.port, boot.room,
                                      self.waiting_timeout_s, self.stats,
                                      self.max_handoff_bytes)
            self.engine.check_handoff(handoff, prompt, boot.room)
        except TransferError as exc:
            raise ApiError(exc.status, str(exc), "server_error") from None
        return handoff

    def info(self) -> dict[str, Any]:
        """What /server_info says of the role."""
        out: dict[str, Any] = {"disaggregation_mode": self.mode}
        if self.bootstrap is not None:
            out["disaggregation_bootstrap_port"] = self.bootstrap.port
        if self.mode == "decode":
            out["disaggregation_waiting_timeout"] = self.waiting_timeout_s
        return out
