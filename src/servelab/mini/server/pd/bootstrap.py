"""The network side of prefill/decode disaggregation: a prefill server's bootstrap server, and the
decode server's fetch of one room's KV from it.

As in SGLang, the router sends each request to both servers with `bootstrap_host`,
`bootstrap_port` and `bootstrap_room` added to its body. The prefill server binds an aiohttp
server on its bootstrap port (`--disaggregation-bootstrap-port`, SGLang's default 8998) and
keeps each prefilled room's handoff there; the decode server asks
`GET http://bootstrap_host:bootstrap_port/kv/{room}?timeout_s=T` and the answer comes when the
prefill is done (long poll), so the decode server holds no KV slot while it waits. A room's
handoff is sent once and dropped; one nobody asks for is dropped after `ttl_s`. A request the
prefill server failed leaves an error in its room, so its decode side fails at once with the
prefill's reason instead of waiting out the timeout.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import threading
import time
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from servelab.mini.engine.kv_handoff import KVHandoff, TransferError
from servelab.mini.server.pd.wire import ROOM_MAX, TransferStats, decode, encode, one_line

# marks the bootstrap server's own "not within the wait" 404, told apart from any other
# server's 404 (a decode pointed at the wrong port must not report a timeout)
_WAITED = "X-Servelab-KV-Waited"
# marks every answer of the bootstrap server's own: only such an answer's `error` is relayed
# into the decode server's 502 (any other body could be anything a client aimed us at)
_OURS = "X-Servelab-Bootstrap"
MAX_WAIT_S = 3600.0  # a long poll never outlives this, whatever the decode side asks for


@dataclass(slots=True)
class _Room:
    handoff: KVHandoff | None
    error: str | None
    created: float


def _nbytes(entry: _Room) -> int:
    h = entry.handoff
    return 0 if h is None else h.kv.nbytes + h.ik.nbytes


class BootstrapServer:
    """Prefill side: rooms of prefilled KV, served on the bootstrap port from its own thread."""

    def __init__(self, host: str, port: int, stats: TransferStats, ttl_s: float = 300.0,
                 max_pending_bytes: int = 1 << 30) -> None:
        self.host, self.port, self.stats, self.ttl_s = host, port, stats, ttl_s
        self.max_pending_bytes = max_pending_bytes
        self._pending_bytes = 0  # KV held for rooms not fetched yet
        self._rooms: dict[int, _Room] = {}  # insertion order = age: the oldest go first
        self._ready: dict[int, asyncio.Event] = {}
        self._pollers: dict[int, int] = {}  # long polls waiting per room
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._expiry: asyncio.Task | None = None
        self._thread: threading.Thread | None = None

    # ---- called from the engine / HTTP threads ----------------------------------------------
    def put(self, handoff: KVHandoff) -> None:
        """Deposit a prefilled room (thread-safe)."""
        self._call(self._store, handoff.room, _Room(handoff, None, time.monotonic()))

    def put_error(self, room: int, message: str) -> None:
        """Record that the prefill of `room` failed (thread-safe)."""
        self._call(self._store, room, _Room(None, message, time.monotonic()))

    def _call(self, fn, *args) -> None:  # noqa: ANN001
        if self._loop is not None:
            self._loop.call_soon_threadsafe(fn, *args)

    # ---- the server's own loop ----------------------------------------------------------------
    def _store(self, room: int, entry: _Room) -> None:
        held = self._rooms.get(room)
        if entry.error is not None and held is not None and held.handoff is not None:
            return  # the KV went out whole: a later failure of the request does not void it
        self._drop(room)
        self._rooms[room] = entry
        self._pending_bytes += _nbytes(entry)
        self._event(room).set()
        # KV nobody fetched (its decode side is gone or far behind) must not grow without
        # bound: past the budget, the oldest rooms are evicted; their fetch fails at once
        for old in list(self._rooms):
            if self._pending_bytes <= self.max_pending_bytes or old == room:
                break
            if self._rooms[old].handoff is not None:
                self._drop(old)
                self._rooms[old] = _Room(None, f"evicted: this prefill server holds at most "
                                         f"{self.max_pending_bytes:,} bytes of KV not yet "
                                         "fetched", time.monotonic())
                self.stats.add("expired")

    def _drop(self, room: int) -> _Room | None:
        entry = self._rooms.pop(room, None)
        if entry is not None:
            self._pending_bytes -= _nbytes(entry)
        return entry

    def _event(self, room: int) -> asyncio.Event:
        ev = self._ready.get(room)
        if ev is None:
            ev = self._ready[room] = asyncio.Event()
        return ev

    @property
    def polls_waiting(self) -> int:
        """Long polls waiting for their room now."""
        return sum(self._pollers.values())

    async def _kv(self, request: web.Request) -> web.StreamResponse:
        raw_room = request.match_info["room"]
        try:
            wait_s = min(float(request.query.get("timeout_s", "30")), MAX_WAIT_S)
        except ValueError:
            wait_s = math.nan
        # at most 20 digits before int(): 8,000 of them raised ValueError (a plain-text 500)
        if not (raw_room.isascii() and raw_room.isdigit() and len(raw_room) <= 20
                and int(raw_room) <= ROOM_MAX
                and 0 <= wait_s <= MAX_WAIT_S):  # nan too: asyncio would wait for it forever
            return _answer(400, f"GET /kv/ROOM?timeout_s=T: ROOM an integer in [0, 2^64), T "
                                f"seconds in [0, {MAX_WAIT_S:g}]")
        room = int(raw_room)
        if room not in self._rooms and not await self._poll(room, wait_s):
            self.stats.add("timeout")
            return _answer(404, f"no prefill for bootstrap_room {room} within {wait_s:g} s",
                           {_WAITED: "1"})
        entry = self._drop(room)
        if not self._pollers.get(room):
            self._ready.pop(room, None)
        if entry is None:  # another fetch of the same room took it first
            self.stats.add("duplicate")
            return _answer(409, f"bootstrap_room {room} was already fetched")
        if entry.error is not None:
            self.stats.add("prefill_failed")
            return _answer(409, entry.error)
        t0 = time.perf_counter()
        body = encode(entry.handoff)
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream",
                                           "Content-Length": str(len(body))})
        await resp.prepare(request)
        await resp.write(body)
        await resp.write_eof()
        self.stats.add("ok", len(body), time.perf_counter() - t0)
        return resp

    async def _poll(self, room: int, wait_s: float) -> bool:
        """Wait up to `wait_s` for `room` (False when it did not come). A poll whose client
        went away is cancelled here (the runner's handler_cancellation): abandoned polls used
        to run until their timeout, up to an hour, about 115 MB per 10,000 of them."""
        ev = self._event(room)
        self._pollers[room] = self._pollers.get(room, 0) + 1
        try:
            await asyncio.wait_for(ev.wait(), wait_s)
            return True
        except TimeoutError:
            return False
        finally:
            self._pollers[room] -= 1
            if not self._pollers[room]:
                del self._pollers[room]
                if room not in self._rooms:
                    self._ready.pop(room, None)

    async def _route(self, _request: web.Request) -> web.Response:
        return web.json_response({"rooms_pending": len(self._rooms), "ttl_s": self.ttl_s,
                                  "polls_waiting": self.polls_waiting})

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(min(self.ttl_s, 5.0))
            now = time.monotonic()
            for room in [r for r, e in self._rooms.items() if now - e.created > self.ttl_s]:
                self._drop(room)
                self._ready.pop(room, None)
                self.stats.add("expired")

    def start(self) -> None:
        """Bind the bootstrap port (errors surface here, before the HTTP server starts) and
        serve from a daemon thread."""
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            app = web.Application(client_max_size=1 << 20)
            app.router.add_get("/kv/{room}", self._kv)
            app.router.add_get("/route", self._route)
            # a stop must not wait for long polls: they are cut (their decode sides fail at once)
            self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5,
                                         handler_cancellation=True)
            try:
                loop.run_until_complete(self._runner.setup())
                site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
                loop.run_until_complete(site.start())
            except BaseException as exc:  # noqa: BLE001 - reported to start()'s caller
                failure.append(exc)
                started.set()
                return
            self._loop = loop
            self._expiry = loop.create_task(self._expire())
            started.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="pd-bootstrap", daemon=True)
        self._thread.start()
        started.wait(30)
        if failure:
            raise failure[0]

    def stop(self) -> None:
        """Close the bootstrap port and end its thread (rooms not yet fetched are dropped)."""
        loop, runner = self._loop, self._runner
        if loop is None or runner is None:
            return
        if self._expiry is not None:
            loop.call_soon_threadsafe(self._expiry.cancel)
        try:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self._loop = None


def _answer(status: int, error: str, headers: dict[str, str] | None = None) -> web.Response:
    """One of the bootstrap server's own JSON answers (marked as such for the decode side)."""
    return web.json_response({"error": error}, status=status, headers={_OURS: "1", **(headers or {})})


def host_port(host: str, port: int) -> str:
    """host:port as a URL writes it ([::1]:8998 for an IPv6 address)."""
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


async def fetch(session: aiohttp.ClientSession, host: str, port: int, room: int,
                timeout_s: float, stats: TransferStats, max_bytes: int) -> KVHandoff:
    """Decode side: the KV of `room` from the prefill's bootstrap server, or TransferError
    (504 when it did not come in time, 502 when the prefill failed or cannot be reached, or
    sent more than `max_bytes`, more than any handoff this server can use)."""
    where = host_port(host, port)
    url = f"http://{where}/kv/{room}"
    t0 = time.perf_counter()
    try:
        async with session.get(url, params={"timeout_s": f"{timeout_s:g}"}, allow_redirects=False,
                               timeout=aiohttp.ClientTimeout(total=timeout_s + 10)) as resp:
            t1 = time.perf_counter()
            if resp.status == 404 and resp.headers.get(_WAITED) == "1":
                stats.add("timeout", wait_seconds=t1 - t0)
                raise TransferError(f"the KV of bootstrap_room {room} did not arrive from the "
                                    f"prefill server at {where} within {timeout_s:g} s", 504)
            if resp.status == 404:  # another server's 404: nothing there serves /kv/ROOM
                stats.add("unreachable", wait_seconds=t1 - t0)
                raise TransferError(f"{where} is not a prefill server's bootstrap port (it "
                                    f"answers GET /kv/{room} with 404): give the port of its "
                                    "--disaggregation-bootstrap-port")
            if resp.status != 200 and resp.headers.get(_OURS) == "1":
                why = _reason(await _read_at_most(resp, 1 << 16))
                stats.add("prefill_failed", wait_seconds=t1 - t0)
                raise TransferError(f"the prefill server at {where} failed bootstrap_room "
                                    f"{room}: {why}")
            if resp.status != 200:  # not our protocol: neither its body nor a redirect is used
                stats.add("unreachable", wait_seconds=t1 - t0)
                raise TransferError(f"{where} is not a prefill server's bootstrap port (it "
                                    f"answers GET /kv/{room} with HTTP {resp.status}; its body "
                                    "is not shown): give the port of its "
                                    "--disaggregation-bootstrap-port")
            body = await _read_at_most(resp, max_bytes)
            if body is None:
                stats.add("malformed", wait_seconds=t1 - t0)
                raise TransferError(f"the bootstrap port at {where} sent more than the "
                                    f"{max_bytes:,} bytes of the largest KV handoff this "
                                    "server can use")
    except TransferError:
        raise
    except TimeoutError:
        stats.add("timeout", wait_seconds=time.perf_counter() - t0)
        raise TransferError(f"the KV of bootstrap_room {room} did not arrive from the prefill "
                            f"server at {where} within {timeout_s:g} s", 504) from None
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        stats.add("unreachable", wait_seconds=time.perf_counter() - t0)
        raise TransferError(f"the prefill server's bootstrap port at {where} cannot be reached "
                            f"({type(exc).__name__}: {one_line(str(exc))[:150]}); is the "
                            "prefill server up?") from None
    t2 = time.perf_counter()
    try:
        handoff = decode(body)
    except TransferError:
        stats.add("malformed", len(body), t2 - t1, t1 - t0)
        raise
    stats.add("ok", len(body), t2 - t1, t1 - t0)
    return handoff


async def _read_at_most(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes | None:
    """The body, or None as soon as it is known to exceed `max_bytes` (a broken or hostile peer
    must not fill the decode server's memory)."""
    if resp.content_length is not None and resp.content_length > max_bytes:
        return None
    buf = bytearray()
    async for chunk in resp.content.iter_chunked(1 << 20):
        buf += chunk
        if len(buf) > max_bytes:
            return None
    return bytes(buf)


def _reason(body: bytes | None) -> str:
    """The `error` of a bootstrap server's JSON answer, on one printable line (ESC, BEL and
    newlines never reach an error message)."""
    try:
        data = json.loads(body or b"")
    except (ValueError, RecursionError):
        data = None
    err = data.get("error") if isinstance(data, dict) else None
    return one_line(err)[:300] if isinstance(err, str) else "(no reason given)"
