"""OpenAI's routes: `/v1/completions` and `/v1/chat/completions` (SSE streaming or not, `usage`,
`stream_options.include_usage`; an engine failure is a JSON 500, or an error event then
[DONE] in a stream, as vLLM does) and `/v1/models`."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from servelab.mini.engine.request import Event
from servelab.mini.server.http import failed, read_body, sse, stream_error, until_gone
from servelab.mini.server.protocol import parse_chat, parse_completion
from servelab.mini.server.state import ServerState


def usage(ev: Event) -> dict:
    """OpenAI's `usage`, with `prompt_tokens_details.cached_tokens` (the prompt tokens the
    prefix cache served) as vLLM and SGLang report it."""
    return {"prompt_tokens": ev.prompt_tokens, "completion_tokens": ev.completion_tokens,
            "total_tokens": ev.prompt_tokens + ev.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": ev.cached_tokens}}


async def answer(state: ServerState, request: Request, body: dict, chat: bool) -> Response:
    """One completion (`chat`: a chat completion), whole or streamed as the body asks (a whole
    one is aborted if its client goes away first)."""
    model_name, ctx = state.model_name, state.engine.args.context_length

    def parse_body() -> tuple:
        state.check_model(body)
        return (parse_chat if chat else parse_completion)(body, ctx)

    st, (prompt, params, stream, include_usage) = await state.open_stream(
        request, body, parse_body)
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
    created = int(time.time())
    obj = "chat.completion" if chat else "text_completion"
    if not stream:
        content, last = await until_gone(request, st.collect())
        if last.finish_reason == "error":
            return failed(last)
        choice = ({"index": 0, "message": {"role": "assistant", "content": content},
                   "finish_reason": last.finish_reason} if chat else
                  {"index": 0, "text": content, "logprobs": None,
                   "finish_reason": last.finish_reason})
        return JSONResponse({"id": rid, "object": obj, "created": created,
                             "model": model_name, "choices": [choice],
                             "usage": usage(last)})

    chunk_obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None, first: bool = False) -> dict:
        if chat:
            delta = {"role": "assistant", "content": ""} if first else (
                {"content": text} if text else {})
            ch = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            ch = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": chunk_obj, "created": created, "model": model_name,
                "choices": [ch]}

    async def gen() -> AsyncIterator[bytes]:
        if chat:
            yield sse(chunk(None, None, first=True))
        last = None
        async for ev in st.events():
            last = ev
            if ev.finish_reason == "error":  # as vLLM: an error object, then [DONE]
                yield sse(stream_error(ev))
                break
            if ev.text or ev.finish_reason is not None:
                yield sse(chunk(ev.text, ev.finish_reason))
        if include_usage and last is not None:
            yield sse({"id": rid, "object": chunk_obj, "created": created,
                       "model": model_name, "choices": [], "usage": usage(last)})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


def routes(state: ServerState) -> APIRouter:
    """The OpenAI routes of the server `state` describes."""
    api = APIRouter()

    @api.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await answer(state, request, await read_body(request), chat=False)

    @api.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await answer(state, request, await read_body(request), chat=True)

    @api.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": 0, "owned_by": "servelab",
            "root": state.model_name, "max_model_len": state.engine.args.context_length}]}

    return api
