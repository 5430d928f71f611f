"""Request validation at the HTTP boundary: JSON bodies -> typed models -> (prompt ids, params).

Every body is parsed into a pydantic model before anything reaches the engine, so a request the
engine could choke on is answered with an OpenAI-shaped 4xx instead: numbers must be finite
(Python's JSON reader accepts `NaN` and `Infinity`), integers must be integers (not booleans,
not 2.5) and inside the range the engine can use (a `seed` must fit torch's 64-bit generator),
text must be encodable UTF-8 (JSON can carry a lone surrogate such as "\\ud800"), lists and
bodies are bounded. Field names follow OpenAI/vLLM (`max_tokens`, `min_tokens`, `ignore_eos`,
`stop`, `seed`) and, for `/generate`, SGLang (`sampling_params.max_new_tokens`, ...). Unknown
fields are ignored, as vLLM and SGLang do.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
)

from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.model import tokenizer as tk

MAX_BODY_BYTES = 8 << 20  # a prompt longer than any context this engine serves, with room
MAX_STOPS = 8
MAX_STOP_CHARS = 256
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # torch.Generator.manual_seed's range


class ApiError(Exception):
    """A client error: HTTP status + message (+ OpenAI error type and the offending field)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


def _integer(v: Any) -> Any:
    """Integers as JSON writes them: 3 or 3.0, never true/false, 2.5 or "3"."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError("must be an integer")
    if isinstance(v, float):
        if not (math.isfinite(v) and v.is_integer()):
            raise ValueError("must be an integer")
        return int(v)
    return v


def _number(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError("must be a number")
    if not math.isfinite(v):
        raise ValueError("must be a finite number")
    return float(v)


def _utf8(s: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"is not valid UTF-8 text (lone surrogate at character {exc.start})"
                         ) from None
    return s


Int = Annotated[int, BeforeValidator(_integer)]
Num = Annotated[float, BeforeValidator(_number)]
Text = Annotated[str, AfterValidator(_utf8)]


def _stops(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if (not isinstance(v, list) or len(v) > MAX_STOPS or not all(
            isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in v)):
        raise ValueError(f"must be a non-empty string or a list of up to {MAX_STOPS} of them "
                         f"(each at most {MAX_STOP_CHARS} characters)")
    return tuple(_utf8(s) for s in v)


Stops = Annotated[tuple[str, ...], BeforeValidator(_stops)]

_CFG = ConfigDict(extra="ignore", strict=True, frozen=True)


class _Sampling(BaseModel):
    """The sampling fields every endpoint shares."""

    model_config = _CFG
    temperature: Num | None = Field(None, ge=0.0, le=100.0)
    top_p: Num | None = Field(None, gt=0.0, le=1.0)
    seed: Int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: Stops = ()
    ignore_eos: bool | None = None


class _StreamOptions(BaseModel):
    model_config = _CFG
    include_usage: bool | None = None


class _OpenAI(_Sampling):
    model: Text | None = None
    max_tokens: Int | None = Field(None, ge=1)
    min_tokens: Int | None = Field(None, ge=0)
    n: Int | None = Field(None, ge=1, le=1)  # one choice per request
    stream: bool | None = None
    stream_options: _StreamOptions | None = None


class CompletionRequest(_OpenAI):
    """POST /v1/completions."""

    prompt: Any


class ChatMessage(BaseModel):
    model_config = _CFG
    role: Literal["system", "user", "assistant"]
    content: Text


class ChatRequest(_OpenAI):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(None, ge=1)


class GenerateSampling(_Sampling):
    """SGLang's `sampling_params` of /generate."""

    max_new_tokens: Int | None = Field(None, ge=1)
    min_new_tokens: Int | None = Field(None, ge=0)
    n: Int | None = Field(None, ge=1, le=1)


class GenerateRequest(BaseModel):
    """POST /generate (SGLang)."""

    model_config = _CFG
    text: Any = None
    input_ids: Any = None
    sampling_params: GenerateSampling | None = None
    stream: bool | None = None


class TokenizeRequest(BaseModel):
    """POST /tokenize (vLLM's and SGLang's shape)."""

    model_config = _CFG
    model: Text | None = None
    prompt: Text | None = None
    text: Text | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = _CFG
    model: Text | None = None
    tokens: list[Int] = Field(max_length=1 << 20)


class StartProfileRequest(BaseModel):
    model_config = _CFG
    output_dir: Text | None = Field(None, min_length=1, max_length=4096)
    num_steps: Int | None = Field(None, ge=1, le=100_000)
    activities: list[Literal["CPU", "GPU", "MEM", "CUDA_PROFILER"]] | None = Field(
        None, min_length=1)


def parse(model: type[BaseModel], body: dict) -> Any:
    """`body` as `model`, or ApiError(400) naming the first bad field and what it must be."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        msg = err["msg"].removeprefix("Value error, ")
        got = repr(err.get("input"))
        got = got if len(got) <= 60 else got[:57] + "..."
        raise ApiError(400, f"'{loc}': {msg}; got {got}" if loc else f"{msg}; got {got}",
                       param=loc or None) from None


def _prompt_ids(v: Any, key: str, ctx: int) -> list[int]:
    """One prompt as token ids: a string, [string], token ids, or [token ids]."""
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str | list):
        v = v[0]
    if isinstance(v, str):
        try:
            return tk.encode(_utf8(v))
        except ValueError as exc:
            raise ApiError(400, f"'{key}' {exc}", param=key) from None
    if isinstance(v, list) and v and all(type(t) is int for t in v):
        if len(v) > ctx:
            raise ApiError(400, f"'{key}' has {len(v)} tokens; this server's context length is "
                                f"{ctx}", param=key)
        bad = [t for t in v if not 0 <= t <= tk.ASSISTANT]
        if bad:
            raise ApiError(400, f"'{key}' has token ids outside the vocabulary [0, "
                                f"{tk.ASSISTANT}]: {bad[:5]}", param=key)
        return list(v)
    raise ApiError(400, f"'{key}' must be a string or a non-empty list of token ids "
                        "(one prompt per request)", param=key)


def _params(s: _Sampling, ctx: int, prompt_len: int, max_key: str, max_tokens: int | None,
            min_key: str, min_tokens: int | None, default_max: int | None) -> SamplingParams:
    room = ctx - prompt_len
    if room < 1:
        raise ApiError(400, f"the prompt has {prompt_len} tokens; this server's context length "
                            f"is {ctx}, so at most {ctx - 1} prompt tokens are allowed")
    if max_tokens is None:
        max_tokens = min(default_max, room) if default_max else room
    if max_tokens > room:
        raise ApiError(400, f"'{max_key}' = {max_tokens} is too large: prompt ({prompt_len} "
                            f"tokens) + {max_key} must be <= the context length {ctx}; "
                            f"ask for at most {room}", param=max_key)
    min_tokens = min_tokens or 0
    if min_tokens > max_tokens:
        raise ApiError(400, f"'{min_key}' = {min_tokens} must be <= {max_key} = {max_tokens}",
                       param=min_key)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if s.temperature is None else s.temperature,
        top_p=1.0 if s.top_p is None else s.top_p,
        seed=s.seed,
        stop=s.stop,
        ignore_eos=bool(s.ignore_eos),
        min_tokens=min_tokens,
    )


def parse_completion(body: dict, ctx: int) -> tuple[list[int], SamplingParams, bool, bool]:
    """/v1/completions -> (prompt ids, params, stream, include_usage)."""
    if "prompt" not in body:
        raise ApiError(400, "missing 'prompt'", param="prompt")
    r = parse(CompletionRequest, body)
    ids = _prompt_ids(r.prompt, "prompt", ctx)
    params = _params(r, ctx, len(ids), "max_tokens", r.max_tokens, "min_tokens", r.min_tokens, 16)
    return ids, params, bool(r.stream), bool(r.stream_options and r.stream_options.include_usage)


def parse_chat(body: dict, ctx: int) -> tuple[list[int], SamplingParams, bool, bool]:
    """/v1/chat/completions -> (prompt ids, params, stream, include_usage)."""
    r = parse(ChatRequest, body)
    ids = tk.apply_chat_template([m.model_dump() for m in r.messages])
    key, mx = (("max_completion_tokens", r.max_completion_tokens)
               if r.max_completion_tokens is not None else ("max_tokens", r.max_tokens))
    params = _params(r, ctx, len(ids), key, mx, "min_tokens", r.min_tokens, None)
    return ids, params, bool(r.stream), bool(r.stream_options and r.stream_options.include_usage)


def parse_generate(body: dict, ctx: int) -> tuple[list[int], SamplingParams, bool]:
    """SGLang /generate -> (prompt ids, params, stream)."""
    r = parse(GenerateRequest, body)
    if r.input_ids is not None:
        ids = _prompt_ids(r.input_ids, "input_ids", ctx)
    elif r.text is not None:
        ids = _prompt_ids(r.text, "text", ctx)
    else:
        raise ApiError(400, "missing 'text' or 'input_ids'", param="text")
    sp = r.sampling_params or GenerateSampling()
    params = _params(sp, ctx, len(ids), "max_new_tokens", sp.max_new_tokens, "min_new_tokens",
                     sp.min_new_tokens, 128)
    return ids, params, bool(r.stream)
