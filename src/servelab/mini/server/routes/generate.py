"""SGLang's `/generate`: cumulative text per event and `meta_info` (finish reason, token counts,
`cached_tokens`, `spec_verify_ct`), whole or streamed."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from servelab.mini.engine.request import Event
from servelab.mini.server.http import failed, read_body, sse, stream_error, until_gone
from servelab.mini.server.protocol import parse_generate
from servelab.mini.server.state import ServerState


def meta(rid: str, ev: Event) -> dict:
    """SGLang's `meta_info` of one event."""
    fr = None
    if ev.finish_reason == "length":
        fr = {"type": "length", "length": ev.completion_tokens}
    elif ev.finish_reason is not None:
        fr = {"type": ev.finish_reason}
    return {"id": rid, "finish_reason": fr, "prompt_tokens": ev.prompt_tokens,
            "completion_tokens": ev.completion_tokens, "cached_tokens": ev.cached_tokens,
            "spec_verify_ct": ev.spec_verify_ct}


def routes(state: ServerState) -> APIRouter:
    """The /generate route of the server `state` describes."""
    api = APIRouter()

    @api.post("/generate")
    async def generate(request: Request) -> Response:
        body = await read_body(request)
        st, (prompt, params, stream) = await state.open_stream(
            request, body, lambda: parse_generate(body, state.engine.args.context_length))
        rid = uuid.uuid4().hex
        if not stream:
            text, last = await until_gone(request, st.collect())
            if last.finish_reason == "error":
                return failed(last)
            return JSONResponse({"text": text, "meta_info": meta(rid, last)})

        async def gen() -> AsyncIterator[bytes]:
            text = ""
            async for ev in st.events():
                if ev.finish_reason == "error":
                    yield sse(stream_error(ev))
                    break
                text += ev.text
                if ev.text or ev.finish_reason is not None:
                    yield sse({"text": text, "meta_info": meta(rid, ev)})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    return api
