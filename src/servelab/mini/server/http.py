"""The HTTP plumbing every route shares: OpenAI-shaped JSON error bodies, the bounded body reader,
SSE framing, the stream of one request's engine events into the event loop, and the watch that
cancels a request's work when its client goes away."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse

from servelab.errors import UserError
from servelab.mini.engine.engine import Engine
from servelab.mini.engine.request import Event
from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.server.protocol import MAX_BODY_BYTES, ApiError

T = TypeVar("T")
CLIENT_GONE = 499  # nginx's "client closed request": nobody reads the answer


async def _gone(request: Request) -> None:
    """Return once the client has closed its connection (the body was read already: the ASGI
    server answers `receive()` only with http.disconnect from then on)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_gone(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or ApiError(499) once the client goes away first, `work` cancelled:
    uvicorn does not cancel a handler whose client left, so a non-streaming request ran to its
    last token (8 x 1,000 tokens for nobody) and a decode server's KV fetch waited out its
    timeout. Cancelling EngineStream.collect aborts the request in the engine (its slot is
    freed at the next step); cancelling a fetch closes its long poll."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_gone(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise ApiError(CLIENT_GONE, "the client went away; the request was aborted")
    return task.result()


def error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    """An OpenAI-style error answer: {"error": {"message", "type", "param", "code"}}."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": status}}, status_code=status)


def failed_message(ev: Event) -> str:
    return (f"the engine failed on this request ({ev.error or 'unknown error'}); it was "
            "aborted and the server keeps serving")


def failed(ev: Event) -> JSONResponse:
    """The answer of a non-streaming request the engine failed (a JSON 500)."""
    return error(500, failed_message(ev), "server_error")


def stream_error(ev: Event) -> dict:
    """The error event that ends a stream the engine failed (as vLLM sends it)."""
    return {"error": {"message": failed_message(ev), "type": "server_error", "param": None,
                      "code": 500}}


async def read_body(request: Request) -> dict:
    """The request's JSON object; ApiError 413 past MAX_BODY_BYTES (from its Content-Length,
    unread, or while reading), 400 when it is not a JSON object."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
        raise ApiError(413, f"request body of {int(size):,} bytes is larger than the "
                            f"{MAX_BODY_BYTES:,} this server accepts")
    raw = bytearray()
    async for chunk in request.stream():  # bounded even without (or with a lying) Content-Length
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise ApiError(413, f"request body is larger than the {MAX_BODY_BYTES:,} bytes this "
                                "server accepts")
    try:
        body = json.loads(raw) if raw else {}
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, huge ints, nesting
        msg = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise ApiError(400, f"request body is not valid JSON: {msg}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def sse(obj: object) -> bytes:
    """One server-sent event carrying `obj` as JSON."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class EngineStream:
    """Engine events of one request, delivered into the event loop; `on_error` hears why the
    engine failed it, or that it was aborted (a prefill server passes it on to the request's
    decode side, which would otherwise wait out its timeout for KV that never comes)."""

    def __init__(self, engine: Engine, prompt: list[int], params: SamplingParams,
                 on_error: Callable[[str], None] | None = None, **submit_kw) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.engine = engine
        self.on_error = on_error
        try:
            self.rid = engine.submit(prompt, params, self._put, **submit_kw)
        except UserError as exc:
            raise ApiError(400, str(exc)) from None
        self.done = False

    def _put(self, ev: Event) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ev)

    async def events(self) -> AsyncIterator[Event]:
        try:
            while True:
                ev = await self.queue.get()
                if ev.finish_reason == "error" and self.on_error is not None:
                    self.on_error(ev.error or "the engine failed the request")
                yield ev
                if ev.finish_reason is not None:
                    self.done = True
                    return
        finally:
            if not self.done:  # client went away: free the slot
                self.engine.abort(self.rid)
                if self.on_error is not None:  # a prefill's decode side must not wait for it
                    self.on_error("the request was aborted before it finished (its client "
                                  "went away)")

    async def collect(self) -> tuple[str, Event]:
        """Wait for the whole answer (non-streaming): (all text, the final event)."""
        text, last = [], None
        async for ev in self.events():
            text.append(ev.text)
            last = ev
        return "".join(text), last
