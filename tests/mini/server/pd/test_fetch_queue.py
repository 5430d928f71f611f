"""The decode server's KV fetch queue (server/pd/fetch_queue.py): at most `per_prefill` fetches
in flight per bootstrap port, the rest served round-robin over clients, FIFO within one; a
waiter that gives up (its client went away) leaves no trace; waits are counted."""

from __future__ import annotations

import asyncio

from servelab.mini.server.pd.fetch_queue import FetchQueue
from servelab.mini.server.pd.wire import TransferStats


def test_fetches_are_limited_per_prefill_and_served_fairly_across_clients():
    async def main() -> None:
        stats = TransferStats("received")
        q = FetchQueue(1, stats)
        order: list[str] = []
        release = asyncio.Event()

        async def fetch(prefill: str, client: str, name: str, hold: bool = False) -> None:
            async with q.slot(prefill, client):
                order.append(name)
                if hold:
                    await release.wait()

        first = asyncio.create_task(fetch("p:1", "flood", "f0", hold=True))
        await asyncio.sleep(0)
        other = asyncio.create_task(fetch("p:2", "flood", "other-prefill"))
        await asyncio.wait_for(other, 1)  # another prefill's slots are its own
        floods = [asyncio.create_task(fetch("p:1", "flood", f"f{i}")) for i in range(1, 6)]
        await asyncio.sleep(0)
        gone = asyncio.create_task(fetch("p:1", "router", "gone"))
        legit = asyncio.create_task(fetch("p:1", "router", "legit"))
        await asyncio.sleep(0)
        assert q.waiting("p:1") == 7 and stats.queue_waiting == 7
        gone.cancel()  # its client went away while it waited
        await asyncio.sleep(0)
        assert q.waiting("p:1") == 6
        release.set()
        await asyncio.gather(first, legit, *floods)
        # round-robin: after the flood's first waiter, the router's request (not f2..f5)
        assert order == ["f0", "other-prefill", "f1", "legit", "f2", "f3", "f4", "f5"]
        assert q.waiting() == 0 and not q._busy and not q._waiting
        assert stats.queued == 7 and stats.queue_waiting == 0 and stats.queue_seconds > 0

    asyncio.run(main())


def test_one_client_holds_at_most_its_share_of_a_prefill():
    """A flood of one prefill's unknown rooms from one client used to hold every connection;
    it holds `per_client` of them now and the router gets the rest at once."""
    async def main() -> None:
        q = FetchQueue(3, TransferStats("received"), per_client=2)
        release = asyncio.Event()
        got: list[str] = []

        async def fetch(client: str, name: str) -> None:
            async with q.slot("p:1", client):
                got.append(name)
                await release.wait()

        floods = [asyncio.create_task(fetch("flood", f"f{i}")) for i in range(5)]
        await asyncio.sleep(0)
        assert got == ["f0", "f1"] and q.waiting("p:1") == 3
        router = asyncio.create_task(fetch("router", "r"))
        await asyncio.sleep(0)
        assert got == ["f0", "f1", "r"]  # at once: the flood is at its own limit
        extra = asyncio.create_task(fetch("router", "r2"))
        await asyncio.sleep(0)
        assert "r2" not in got and q.waiting("p:1") == 4  # the prefill is full now
        release.set()
        await asyncio.gather(router, extra, *floods)
        assert sorted(got) == ["f0", "f1", "f2", "f3", "f4", "r", "r2"]
        assert not q._busy and not q._held and not q._waiting

    asyncio.run(main())
