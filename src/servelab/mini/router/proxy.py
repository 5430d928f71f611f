"""The requests the router passes to workers. A generation request (`/v1/completions`,
`/v1/chat/completions`, `/generate`) goes to one prefill and one decode server at once, with
SGLang's bootstrap fields added; the prefill's answer is awaited (its failure is the request's
answer), then the decode server's answer is passed through byte for byte. Read-only paths a
benchmark uses (`/v1/models`, `/tokenize`, `/detokenize`) go to a decode worker."""

from __future__ import annotations

import asyncio
import json
import random
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from servelab.mini.router.state import RouterState, error, wrong_role
from servelab.redaction import redact_text

GENERATE_PATHS = ("/v1/completions", "/v1/chat/completions", "/generate")
FORWARD_GET = ("/v1/models",)
FORWARD_POST = ("/tokenize", "/detokenize")
# After a decode server's failure, how long the router waits for the prefill's answer (whose
# status says better what was wrong) before it answers with the decode's.
PREFILL_GRACE_S = 1.0


def host_of(url: str) -> str:
    """The host part of a worker URL (what sglang_router sends as bootstrap_host)."""
    return urlsplit(url).hostname or "127.0.0.1"


async def _prefill(s: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, bytes, str]:
    async with s.post(url, json=body) as r:
        return r.status, await r.read(), r.content_type


async def _stream_decode(state: RouterState, request: web.Request, dresp: aiohttp.ClientResponse,
                         path: str, d_url: str) -> web.StreamResponse:
    """Pass the decode server's answer through as it comes; a decode that breaks off mid-stream
    ends the client's stream with an error event and [DONE] (a JSON body: the connection)."""
    counters = state.counters
    out = web.StreamResponse(status=dresp.status)
    out.content_type = dresp.content_type
    if dresp.charset:
        out.charset = dresp.charset
    await out.prepare(request)
    chunks = dresp.content.iter_any()
    while True:
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            break
        except (aiohttp.ClientError, TimeoutError) as exc:  # decode broke off mid-answer
            counters.upstream_error("decode")
            counters.done(path, 502)
            if out.content_type != "text/event-stream":
                raise  # drop the connection: a cut JSON body must not look complete
            msg = redact_text(f"decode server {d_url} broke off: {type(exc).__name__}: {exc}")
            await out.write(b"data: " + json.dumps({"error": {  # as vLLM ends a failed
                "message": msg, "type": "server_error", "param": None,  # stream
                "code": 502}}).encode() + b"\n\ndata: [DONE]\n\n")
            await out.write_eof()
            return out
        await out.write(chunk)
    await out.write_eof()
    counters.done(path, dresp.status)
    return out


async def dispatch(state: RouterState, request: web.Request, path: str, body: dict,
                   p_url: str, d_url: str) -> web.StreamResponse:
    """Send `body` to the prefill and the decode server at once; answer with the prefill's
    failure if it failed, else with the decode server's answer."""
    counters, s = state.counters, state.s
    pf = asyncio.ensure_future(_prefill(s, p_url + path, body))
    try:
        dresp = await s.post(d_url + path, json=body)
    except asyncio.CancelledError:
        pf.cancel()
        raise
    except (aiohttp.ClientError, TimeoutError) as exc:
        pf.cancel()
        counters.upstream_error("decode")
        counters.done(path, 502)
        return error(502, f"decode server {d_url} failed: {type(exc).__name__}: {exc}")
    try:
        try:
            if dresp.status != 200:
                # decode failed (its KV never came, or the prefill failed it): a prefill that
                # refused the request answers within moments with the better status; one
                # that hangs must not hold the request until --request-timeout-secs
                done, _ = await asyncio.wait({pf}, timeout=PREFILL_GRACE_S)
                if not done:
                    pf.cancel()
                    counters.done(path, dresp.status)
                    return web.Response(status=dresp.status, body=await dresp.read(),
                                        content_type=dresp.content_type)
            p_status, p_body, p_type = await pf
        except (aiohttp.ClientError, TimeoutError) as exc:
            counters.upstream_error("prefill")
            counters.done(path, 502)
            return error(502, f"prefill server {p_url} failed: {type(exc).__name__}: {exc}")
        if p_status != 200:  # the request failed before decode could start: say why
            counters.done(path, p_status)
            return web.Response(status=p_status, body=p_body, content_type=p_type)
        return await _stream_decode(state, request, dresp, path, d_url)
    finally:
        dresp.release()
        pf.cancel()  # a no-op once the prefill answered


def add_routes(app: web.Application, state: RouterState) -> None:
    """The generation routes and the forwarded read-only paths."""
    counters, cfg = state.counters, state.cfg

    async def generate(request: web.Request) -> web.StreamResponse:
        path = request.path
        try:
            body = await request.json()
        except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, huge ints, deep nesting
            counters.done(path, 400)
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
            return error(400, f"request body is not valid JSON: {why}", "invalid_request_error")
        if not isinstance(body, dict):
            counters.done(path, 400)
            return error(400, "request body must be a JSON object", "invalid_request_error")
        p, d = cfg.prefills[state.pick_p()], cfg.decodes[state.pick_d()]
        wrong = await wrong_role(state, p.url, "prefill") or await wrong_role(state, d, "decode")
        if wrong:
            counters.done(path, 503)
            return error(503, f"worker in the wrong role: {wrong}; swap --prefill and --decode")
        body = {**body, "bootstrap_host": host_of(p.url), "bootstrap_port": p.bootstrap_port,
                "bootstrap_room": random.getrandbits(63)}
        counters.in_flight += 1
        try:
            return await dispatch(state, request, path, body, p.url, d)
        finally:
            counters.in_flight -= 1

    async def forward(request: web.Request) -> web.Response:
        d = cfg.decodes[state.pick_d()]
        data = await request.read() if request.method == "POST" else None
        try:
            async with state.s.request(request.method, d + request.path, data=data,
                                       headers={"Content-Type": "application/json"}) as r:
                return web.Response(status=r.status, body=await r.read(),
                                    content_type=r.content_type)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return error(502, f"decode server {d} failed: {type(exc).__name__}: {exc}")

    for pth in GENERATE_PATHS:
        app.router.add_post(pth, generate)
    for pth in FORWARD_GET:
        app.router.add_get(pth, forward)
    for pth in FORWARD_POST:
        app.router.add_post(pth, forward)
