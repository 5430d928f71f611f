"""`/tokenize` and `/detokenize` (vLLM's and SGLang's shapes)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from servelab.mini.model import tokenizer as tk
from servelab.mini.server.http import read_body
from servelab.mini.server.protocol import ApiError, DetokenizeRequest, TokenizeRequest, parse
from servelab.mini.server.state import ServerState


def routes(state: ServerState) -> APIRouter:
    """The tokenizer routes of the server `state` describes."""
    api = APIRouter()
    engine = state.engine

    @api.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        body = await read_body(request)
        state.check_model(body)
        r = parse(TokenizeRequest, body)
        if r.messages is not None:
            ids = tk.apply_chat_template([m.model_dump() for m in r.messages])
        else:
            text = r.prompt if r.prompt is not None else r.text
            if text is None:
                raise ApiError(400, "/tokenize needs 'prompt' (a string) or 'messages'",
                               param="prompt")
            ids = tk.encode(text, add_bos=r.add_special_tokens)
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.args.context_length,
                "token_strs": [tk.token_str(t) for t in ids] if r.return_token_strs else None}

    @api.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        body = await read_body(request)
        ids = parse(DetokenizeRequest, body).tokens
        if not all(0 <= t < engine.cfg.vocab_size for t in ids):
            raise ApiError(400, f"'tokens' must be a list of ints in [0, {engine.cfg.vocab_size})",
                           param="tokens")
        return {"prompt": tk.decode(ids)}

    return api
