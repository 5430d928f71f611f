"""Request parsing and validation for the HTTP API: JSON bodies -> (prompt ids, SamplingParams).

Every problem becomes an ApiError naming the field and what is allowed, answered with a 4xx.
Field names follow OpenAI/vLLM (`max_tokens`, `min_tokens`, `ignore_eos`, `stop`, `seed`) and,
for `/generate`, SGLang (`sampling_params.max_new_tokens`, `min_new_tokens`, ...).
"""

from __future__ import annotations

from servelab.mini import tokenizer as tk
from servelab.mini.sampling import SamplingParams


class ApiError(Exception):
    """A client error: HTTP status + message."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def _num(body: dict, key: str, default, kind: type, lo=None, hi=None):
    v = body.get(key, default)
    if v is None:
        return default
    ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind is int:
        ok = ok and float(v).is_integer()
    if not ok:
        raise ApiError(400, f"'{key}' must be {'an integer' if kind is int else 'a number'}, "
                            f"got {v!r}")
    v = kind(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        want = (f"in [{lo}, {hi}]" if lo is not None and hi is not None
                else f">= {lo}" if lo is not None else f"<= {hi}")
        raise ApiError(400, f"'{key}' must be {want}, got {v}")
    return v


def _bool(body: dict, key: str, default: bool) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(400, f"'{key}' must be true or false, got {v!r}")
    return v


def _stop(body: dict, key: str = "stop") -> tuple[str, ...]:
    v = body.get(key)
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v) or len(v) > 8:
        raise ApiError(400, f"'{key}' must be a non-empty string or a list of up to 8 of them")
    return tuple(v)


def _params(body: dict, ctx: int, prompt_len: int, max_key: str, min_key: str,
            default_max: int | None) -> SamplingParams:
    room = ctx - prompt_len
    if room < 1:
        raise ApiError(400, f"the prompt has {prompt_len} tokens; this server's context length "
                            f"is {ctx}, so at most {ctx - 1} prompt tokens are allowed")
    max_tokens = _num(body, max_key, default_max if default_max else room, int, 1)
    if max_tokens > room:
        raise ApiError(400, f"'{max_key}' = {max_tokens} is too large: prompt ({prompt_len} "
                            f"tokens) + {max_key} must be <= the context length {ctx}; "
                            f"ask for at most {room}")
    min_tokens = _num(body, min_key, 0, int, 0, max_tokens)
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ApiError(400, f"'seed' must be an integer, got {seed!r}")
    _num(body, "n", 1, int, 1, 1)  # validated only: one choice per request
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_num(body, "temperature", 1.0, float, 0.0, 100.0),
        top_p=_num(body, "top_p", 1.0, float, 1e-6, 1.0),
        seed=seed,
        stop=_stop(body),
        ignore_eos=_bool(body, "ignore_eos", False),
        min_tokens=min_tokens,
    )


def _stream(body: dict) -> tuple[bool, bool]:
    stream = _bool(body, "stream", False)
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError(400, "'stream_options' must be an object")
    return stream, _bool(opts, "include_usage", False)


def _prompt_ids(v, key: str) -> list[int]:
    if isinstance(v, str):
        return tk.encode(v)
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
        return tk.encode(v[0])
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], list):
        v = v[0]
    if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool)
                                         for t in v):
        bad = [t for t in v if not 0 <= t < tk.ASSISTANT + 1]
        if bad:
            raise ApiError(400, f"'{key}' has token ids outside the vocabulary: {bad[:5]}")
        return list(v)
    raise ApiError(400, f"'{key}' must be a string or a non-empty list of token ids "
                        "(one prompt per request)")


def parse_completion(body: dict, ctx: int) -> tuple[list[int], SamplingParams, bool, bool]:
    """/v1/completions -> (prompt ids, params, stream, include_usage)."""
    if "prompt" not in body:
        raise ApiError(400, "missing 'prompt'")
    ids = _prompt_ids(body["prompt"], "prompt")
    return (ids, _params(body, ctx, len(ids), "max_tokens", "min_tokens", 16), *_stream(body))


def parse_chat(body: dict, ctx: int) -> tuple[list[int], SamplingParams, bool, bool]:
    """/v1/chat/completions -> (prompt ids, params, stream, include_usage)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects")
    for i, m in enumerate(msgs):
        if (not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant")
                or not isinstance(m.get("content"), str)):
            raise ApiError(400, f"messages[{i}] must be {{'role': system|user|assistant, "
                                "'content': string}")
    ids = tk.apply_chat_template(msgs)
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return (ids, _params(body, ctx, len(ids), key, "min_tokens", None), *_stream(body))


def parse_generate(body: dict, ctx: int) -> tuple[list[int], SamplingParams, bool]:
    """SGLang /generate -> (prompt ids, params, stream)."""
    if "input_ids" in body:
        ids = _prompt_ids(body["input_ids"], "input_ids")
    elif "text" in body:
        ids = _prompt_ids(body["text"], "text")
    else:
        raise ApiError(400, "missing 'text' or 'input_ids'")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise ApiError(400, "'sampling_params' must be an object")
    params = _params(sp, ctx, len(ids), "max_new_tokens", "min_new_tokens", 128)
    return ids, params, _bool(body, "stream", False)
