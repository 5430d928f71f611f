"""How many KV fetches a decode server has in flight to each prefill, and who goes next.

A fetch is a long poll: it holds a connection until the prefill is done, up to the waiting
timeout (300 s by default) when the room never comes. One shared pool of 1,024 connections let
1,100 polls of unknown rooms (any client can send them) hold every connection, and a legitimate
PD request then waited 16 s for one. So each prefill (its bootstrap host:port) has its own
limit, `per_prefill` fetches at once: polls aimed at one bootstrap port never delay another's;
and one client (the peer address) holds at most `per_client` of them, so a client's flood of a
real prefill leaves the rest to the others (the router). Past a limit, requests wait in a fair
queue: round-robin over clients, FIFO within a client, so a client's flood waits behind itself
rather than ahead of others. A
request that waits is counted (/metrics `servelab:kv_fetch_queued_total`, the seconds waited,
the number waiting now) and logged, at most once per prefill every LOG_EVERY_S seconds.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from servelab.mini.server.pd.wire import TransferStats

DEFAULT_PER_PREFILL = 1024  # the old shared pool's size, now per prefill
DEFAULT_PER_CLIENT = 512  # half of it: one client's flood leaves the router the other half
LOG_EVERY_S = 10.0


class FetchQueue:
    """At most `per_prefill` fetches in flight per bootstrap port, `per_client` of them from
    one client; the rest queue fairly (round-robin over clients, FIFO within one)."""

    def __init__(self, per_prefill: int, stats: TransferStats,
                 per_client: int | None = None) -> None:
        self.per_prefill, self.stats = per_prefill, stats
        self.per_client = per_client or per_prefill
        self._busy: dict[str, int] = {}  # prefill -> fetches in flight
        self._held: dict[tuple[str, str], int] = {}  # (prefill, client) -> fetches in flight
        # prefill -> client -> its waiters, oldest first; dict order = whose turn is next
        self._waiting: dict[str, dict[str, deque[asyncio.Future]]] = {}
        self._logged: dict[str, float] = {}

    def waiting(self, prefill: str | None = None) -> int:
        """Requests waiting for a fetch slot (to `prefill`, or to any)."""
        groups = [self._waiting.get(prefill, {})] if prefill else list(self._waiting.values())
        return sum(len(q) for g in groups for q in g.values())

    @asynccontextmanager
    async def slot(self, prefill: str, client: str) -> AsyncIterator[None]:
        """Hold one of `prefill`'s fetch slots for the body of the `async with`."""
        if self._free(prefill, client):
            self._take(prefill, client)
        else:
            await self._wait(prefill, client)
        try:
            yield
        finally:
            self._release(prefill, client)

    def _free(self, prefill: str, client: str) -> bool:
        return (self._busy.get(prefill, 0) < self.per_prefill
                and self._held.get((prefill, client), 0) < self.per_client)

    def _take(self, prefill: str, client: str) -> None:
        self._busy[prefill] = self._busy.get(prefill, 0) + 1
        self._held[prefill, client] = self._held.get((prefill, client), 0) + 1

    async def _wait(self, prefill: str, client: str) -> None:
        fut = asyncio.get_running_loop().create_future()
        clients = self._waiting.setdefault(prefill, {})
        clients.setdefault(client, deque()).append(fut)
        t0 = time.perf_counter()
        self.stats.queue(waiting=1)
        self._log(prefill)
        try:
            await fut  # resolved by _grant: the slot is taken for us
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted as we were cancelled
                self._release(prefill, client)
            else:
                q = clients.get(client)
                if q is not None and fut in q:
                    q.remove(fut)
                    if not q:
                        del clients[client]
                if not clients and self._waiting.get(prefill) is clients:
                    del self._waiting[prefill]
            raise
        finally:
            self.stats.queue(waiting=-1, seconds=time.perf_counter() - t0)

    def _release(self, prefill: str, client: str) -> None:
        self._busy[prefill] -= 1
        if not self._busy[prefill]:
            del self._busy[prefill]
        self._held[prefill, client] -= 1
        if not self._held[prefill, client]:
            del self._held[prefill, client]
        self._grant(prefill)

    def _grant(self, prefill: str) -> None:
        """Hand free slots to waiters, one client after another (each served goes to the back
        of the round)."""
        clients = self._waiting.get(prefill)
        while clients and self._busy.get(prefill, 0) < self.per_prefill:
            turn = next((c for c in clients if self._free(prefill, c)), None)
            if turn is None:  # every waiting client is at its own limit
                break
            q = clients.pop(turn)
            fut = q.popleft()
            if q:
                clients[turn] = q
            if not fut.done():
                self._take(prefill, turn)
                fut.set_result(None)
        if clients is not None and not clients:
            del self._waiting[prefill]

    def _log(self, prefill: str) -> None:
        now = time.monotonic()
        if now - self._logged.get(prefill, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._logged[prefill] = now
            print(f"servelab mini: {self.waiting(prefill)} request(s) wait for a KV fetch slot "
                  f"to the bootstrap port at {prefill} (at most {self.per_prefill} fetches in "
                  f"flight per prefill, {self.per_client} per client)", file=sys.stderr,
                  flush=True)
