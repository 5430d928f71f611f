"""What a scripted server (servelab.bench.scripted_server) does with each request: the `Script`
(timings, failure modes, API flavour), its tokenizer, and the server-side record of a request.

Timing: the first content chunk (1 token, "prefill") is sent `ttft_ms` after the request
arrives, then one chunk of `tokens_per_chunk` tokens (one "verify step") every `gap_ms`
(absolute schedule, so sleep overshoot does not accumulate); the last chunk is cut short by
`max_tokens`. Speculative counters follow: per verify step of k tokens, 1 draft of k-1 tokens
with k-1 accepted, so the true acceptance length is exactly `tokens_per_chunk` when
`(max_tokens - 1) % tokens_per_chunk == 0`. With `gap_ms = 0` chunks follow each other with no
delay, each its own write (the client-overhead benchmark).
An idle request (no `ignore_eos`/`min_tokens`) stops at `natural_len` tokens when that is set.

Failure modes (`--fail-rate R --fail-modes m1,m2`, seeded; or per request by putting
`[[fail:MODE]]` in the prompt): `http<code>` (e.g. `http500`, `http429`: an error status, JSON
body), `malformed` (a broken `data:` line mid-stream), `cut` (connection dropped mid-stream),
`stall` (stops sending mid-stream for `stall_s`), `no_done` (stream ends without `[DONE]`),
`error_event` (an error object in the stream, then `[DONE]`, as vLLM reports engine errors).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

FAIL_MODES = ("malformed", "cut", "stall", "no_done", "error_event")  # plus "http<code>"
_FAIL_RE = re.compile(r"\[\[fail:([a-z_0-9]+)\]\]")


@dataclass(frozen=True, slots=True)
class Script:
    """What the server does with every request."""

    ttft_ms: float = 50.0
    gap_ms: float = 10.0
    tokens_per_chunk: int = 1
    natural_len: int | None = None  # tokens produced when EOS is not ignored
    default_max_tokens: int = 16
    fail_rate: float = 0.0
    fail_modes: tuple[str, ...] = ("http500",)
    stall_s: float = 3600.0
    seed: int = 0
    model: str = "scripted-model"
    flavor: str = "vllm"  # vllm: spec_decode_* counters; sglang: gauges + /get_server_info
    tokenize: bool = True
    metrics: bool = True  # False: /metrics answers 404 (tests the client-side estimate)
    record_log: bool = True
    api_key: str | None = None  # when set, generation endpoints need `Authorization: Bearer KEY`

    def __post_init__(self) -> None:
        if self.ttft_ms < 0 or self.gap_ms < 0:
            raise ValueError("ttft_ms and gap_ms must be >= 0")
        if self.tokens_per_chunk < 1:
            raise ValueError("tokens_per_chunk must be >= 1")
        if not 0.0 <= self.fail_rate <= 1.0:
            raise ValueError("fail_rate must be in [0, 1]")
        if self.flavor not in ("vllm", "sglang"):
            raise ValueError("flavor must be 'vllm' or 'sglang'")
        for m in self.fail_modes:
            _check_mode(m)


def _check_mode(mode: str) -> None:
    if mode in FAIL_MODES:
        return
    if mode.startswith("http") and mode[4:].isdigit() and 400 <= int(mode[4:]) <= 599:
        return
    raise ValueError(f"unknown failure mode {mode!r}; use http<4xx|5xx> or one of {FAIL_MODES}")


@dataclass(slots=True)
class RequestRecord:
    """Server-side record of one request (returned by /_scripted/log)."""

    id: str
    path: str
    stream: bool
    arrival_ns: int
    prompt_tokens: int
    max_tokens: int
    completion_tokens: int
    fail: str | None
    send_ns: list[int] = field(default_factory=list)  # after each content chunk left the server
    chunk_tokens: list[int] = field(default_factory=list)
    done_ns: int | None = None


def count_tokens(text: str) -> int:
    """The scripted tokenizer: one token per whitespace-separated word."""
    return len(text.split())


def requested_failure(prompt: str) -> str | None:
    """The failure mode a prompt asks for with `[[fail:MODE]]`, if any."""
    m = _FAIL_RE.search(prompt)
    return m.group(1) if m else None
