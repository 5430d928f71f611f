"""How many KV fetches a decode server has in flight to each prefill, and who goes next.

A fetch is a long poll: it holds a connection until the prefill is done, up to the waiting
timeout (300 s by default) when the room never comes. One shared pool of 1,024 connections let
1,100 polls of unknown rooms (any client can send them) hold every connection, and a legitimate
PD request then waited 16 s for one. So each prefill (its bootstrap host:port) has its own
limit, `per_prefill` fetches at once: polls aimed at one bootstrap port never delay another's.
Past the limit, requests wait in a fair queue: round-robin over clients (the peer address),
FIFO within a client, so a client's flood waits behind itself rather than ahead of others. A
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

DEFAULT_PER_PREFILL = 512  # half the old shared pool, per prefill; a request holds one at most
LOG_EVERY_S = 10.0


class FetchQueue:
    """At most `per_prefill` fetches in flight per bootstrap port; the rest queue fairly."""

    def __init__(self, per_prefill: int, stats: TransferStats) -> None:
        self.per_prefill, self.stats = per_prefill, stats
        self._busy: dict[str, int] = {}  # prefill -> fetches in flight
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
        if self._busy.get(prefill, 0) < self.per_prefill and prefill not in self._waiting:
            self._busy[prefill] = self._busy.get(prefill, 0) + 1
        else:
            await self._wait(prefill, client)
        try:
            yield
        finally:
            self._release(prefill)

    async def _wait(self, prefill: str, client: str) -> None:
        fut = asyncio.get_running_loop().create_future()
        clients = self._waiting.setdefault(prefill, {})
        clients.setdefault(client, deque()).append(fut)
        t0 = time.perf_counter()
        self.stats.queue(waiting=1)
        self._log(prefill)
        try:
            await fut  # resolved by _release: the slot passes to us without being freed
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # handed the slot as we were cancelled
                self._release(prefill)
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

    def _release(self, prefill: str) -> None:
        clients = self._waiting.get(prefill)
        while clients:
            client = next(iter(clients))
            q = clients.pop(client)
            fut = q.popleft()
            if q:
                clients[client] = q  # this client's next waiter goes to the back of the round
            if not fut.done():
                fut.set_result(None)
                if not clients:
                    del self._waiting[prefill]
                return
        self._waiting.pop(prefill, None)
        self._busy[prefill] -= 1
        if not self._busy[prefill]:
            del self._busy[prefill]

    def _log(self, prefill: str) -> None:
        now = time.monotonic()
        if now - self._logged.get(prefill, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._logged[prefill] = now
            print(f"servelab mini: {self.waiting(prefill)} request(s) wait for a KV fetch slot "
                  f"to the bootstrap port at {prefill} ({self.per_prefill} in flight, the "
                  "most per prefill)", file=sys.stderr, flush=True)
