"""What a scripted server (servelab.bench.scripted.server) does with each request: the `Script`
(timings, failure modes, API flavour), its tokenizer, and the server-side record of a request.

Timing: the first content chunk (1 token, "prefill") is sent `ttft_ms` after the request
is admitted, then one chunk of `tokens_per_chunk` tokens (one "verify step") every `gap_ms`
(a schedule of due times, so sleep overshoot does not accumulate); the last chunk is cut short
by `max_tokens`.

Latency-vs-load law (off by default: every request admitted at once, fixed timings):

- **Slots** (`max_running = c`, an engine's max running requests / batch size): at most c
  requests are served at once; later ones wait in one FIFO queue, and the wait is part of
  their TTFT. A request holds its slot from admission until its last chunk is sent.
- **Batch slowdown** (`gap_per_running_ms = k`): each decode step takes
  `gap_ms + k * (b - 1)` ms, b = requests holding a slot when the step starts (a decode step
  costs more as the batch grows), so TPOT rises with load.

With k = 0 a request of n output tokens (tokens_per_chunk 1) holds its slot for exactly
S = ttft_ms + (n - 1) * gap_ms, and the server is a c-server FIFO queue with deterministic
service: it completes at most c / S requests/s, and the TTFT of a request is ttft_ms plus its
wait for a slot, which, given the arrival times, follows from Kiefer-Wolfowitz's recursion
(each request takes the slot that frees first). That is the known SLO capacity the sweep is
tested against (tests/bench/scenarios/test_sweep_scripted.py). In closed loop at concurrency
b <= c, TPOT is exactly `gap_ms + k * (b - 1)` once every in-flight request is decoding. Speculative counters follow: per verify step of k tokens, 1 draft of k-1 tokens
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

import asyncio
import re
import zlib
from collections import deque
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
    api_key: str | None = None  # when set, generation and /metrics need `Authorization: Bearer KEY`
    max_running: int | None = None  # slots (the load law above); None: no queue
    gap_per_running_ms: float = 0.0  # added to each decode step per other request in a slot
    cache_block: int | None = None  # prefix cache of this block size; None: no cache reported
    # the log keeps each request's prompt (chat: its messages) as received, and each answer
    # is made of a word of its own ("w7" for request 7): a multi-turn test can then check that
    # a turn sent exactly the earlier answers (tests/bench/sessions)
    echo: bool = False

    def step_ms(self, batch: int) -> float:
        """Duration of one decode step with `batch` requests in slots (the slowdown law)."""
        return self.gap_ms + self.gap_per_running_ms * max(batch - 1, 0)

    def __post_init__(self) -> None:
        if self.ttft_ms < 0 or self.gap_ms < 0:
            raise ValueError("ttft_ms and gap_ms must be >= 0")
        if self.max_running is not None and self.max_running < 1:
            raise ValueError("max_running must be >= 1 (or None: no queue)")
        if self.cache_block is not None and self.cache_block < 1:
            raise ValueError("cache_block must be >= 1 (or None: no prefix cache)")
        if self.gap_per_running_ms < 0:
            raise ValueError("gap_per_running_ms must be >= 0")
        if self.tokens_per_chunk < 1:
            raise ValueError("tokens_per_chunk must be >= 1")
        if not 0.0 <= self.fail_rate <= 1.0:
            raise ValueError("fail_rate must be in [0, 1]")
        if self.flavor not in ("vllm", "sglang"):
            raise ValueError("flavor must be 'vllm' or 'sglang'")
        for m in self.fail_modes:
            _check_mode(m)


class Slots:
    """The law's slots: at most `n` holders (None: unlimited), the rest wait in FIFO order.
    `busy` counts holders, which is the batch size b of the slowdown law."""

    def __init__(self, n: int | None) -> None:
        self.n = n
        self.busy = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Requests queued for a slot (the server's queue depth)."""
        return sum(1 for f in self._waiters if not f.done())

    async def acquire(self) -> bool:
        """Take a slot; True when the request had to wait for it."""
        if self.n is None or (self.busy < self.n and not self._waiters):
            self.busy += 1
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut  # release() hands its slot over: `busy` stays as it is
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed a slot just as the client went away: pass it on
            else:
                self._waiters.remove(fut)
            raise
        return True

    def release(self) -> None:
        """Give the slot to the longest waiter, or free it."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.busy -= 1


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
    cached_tokens: int | None = None  # what the prefix cache reused (Script.cache_block)
    admit_ns: int | None = None  # when it got a slot (the end of its queue wait)
    send_ns: list[int] = field(default_factory=list)  # after each content chunk left the server
    chunk_tokens: list[int] = field(default_factory=list)
    done_ns: int | None = None
    word: str = " tok"  # what each answer token is (Script.echo: a word per request)
    text: object = None  # Script.echo: the prompt, or the chat messages, as received


def count_tokens(text: str) -> int:
    """The scripted tokenizer: one token per whitespace-separated word."""
    return len(text.split())


def token_ids(text: str) -> list[int]:
    """The scripted tokenizer's ids: one per word, equal words equal ids (a stable hash), so
    that prompts sharing a prefix share token ids, as with a real tokenizer."""
    return [zlib.crc32(w.encode()) & 0x7FFFFFFF for w in text.split()]


class PrefixCache:
    """A prefix cache for the scripted server: the longest prefix of a prompt's token ids that
    an earlier prompt had, counted in whole blocks of `block` tokens as SGLang (page size) and
    vLLM (block size) count `cached_tokens`. Unbounded: nothing is evicted."""

    def __init__(self, block: int) -> None:
        self.block = block
        self.seen: set[int] = set()

    def lookup_insert(self, ids: list[int]) -> int:
        """Cached tokens of this prompt; then its blocks are cached."""
        b = self.block
        h = 0
        hashes = []
        for i in range(0, len(ids) - len(ids) % b, b):
            h = hash((h, tuple(ids[i:i + b])))
            hashes.append(h)
        hit = 0
        for h in hashes:
            if h not in self.seen:
                break
            hit += b
        self.seen.update(hashes)
        return hit


def requested_failure(prompt: str) -> str | None:
    """The failure mode a prompt asks for with `[[fail:MODE]]`, if any."""
    m = _FAIL_RE.search(prompt)
    return m.group(1) if m else None
