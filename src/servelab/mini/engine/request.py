"""What one request is to the engine: its record while it runs (and how its sampled tokens
become its text: EOS, stop strings, max_tokens), the events it emits, the reasons it can finish
with (vLLM's `finished_reason` values plus "error"), and the lifetime counters /metrics and
/server_info read. Delivery to a listener never raises into the engine."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from servelab.errors import UserError
from servelab.mini.engine.prefix_cache import Match
from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.model import tokenizer as tk


@dataclass(frozen=True, slots=True)
class Event:
    """What one engine step produced for one request."""

    text: str
    token_ids: list[int]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    spec_verify_ct: int
    error: str | None = None  # why the engine failed this request (finish_reason "error")
    cached_tokens: int = 0  # prompt tokens whose KV was reused, not computed (prefix cache)


# vLLM's `finished_reason` label values, plus "error" for requests the engine failed
FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass(slots=True)
class Request:
    rid: int
    prompt: list[int]
    params: SamplingParams
    callback: Callable[[Event], None]
    gen: torch.Generator | None = None
    slot: int = -1
    out: list[int] = field(default_factory=list)
    last: int = -1  # last sampled token, not yet in the main KV cache
    pos: int = -1  # its position
    drafts: list[int] = field(default_factory=list)
    decoder: tk.StreamDecoder = field(default_factory=tk.StreamDecoder)
    held: str = ""  # text held back because it may start a stop string
    finish: str | None = None
    spec_verify_ct: int = 0
    # the prefix cache's blocks this prompt starts with (matched at admission, copied into the
    # slot before prefill); cached_tokens: the prompt tokens not computed (on a decode server:
    # those its prefill server did not compute)
    match: Match = Match()
    cached_tokens: int = 0
    # what caching its finished sequence needs (with MTP): the MTP layer's rows are valid for
    # positions < mtp_upto, and the main model's hidden states at block-end positions
    mtp_upto: int = 0
    block_hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    # prefill/decode disaggregation (kv_handoff.py): the bootstrap room of the request; on a
    # prefill server, where its KV goes once prefilled; on a decode server, the KV it came with
    room: int = -1
    # (typed Any: kv_handoff.py, which reads and writes requests, is above this module)
    export: Callable[[Any], None] | None = None  # takes a kv_handoff.KVHandoff
    handoff: Any = None  # a kv_handoff.KVHandoff until installed into the request's slot

    def take(self, toks: list[int]) -> tuple[str, list[int]]:
        """Add sampled tokens to the output until one finishes the request (EOS, a stop string,
        max_tokens; `finish` is set). Returns (the text to emit now, the tokens taken). Text
        that may begin a stop string is held back until the next tokens tell."""
        p = self.params
        text, taken, eos = "", [], False
        for t in toks:
            taken.append(t)
            self.out.append(t)
            if t == tk.EOS and not p.ignore_eos:
                self.finish, eos = "stop", True
                break
            piece = self.held + self.decoder.feed([t])
            self.held = ""
            if p.stop:
                hit = min((i for i in (piece.find(s) for s in p.stop) if i >= 0), default=-1)
                if hit >= 0:
                    text += piece[:hit]
                    self.finish = "stop"
                    break
                keep = stop_prefix_len(piece, p.stop)
                if keep:
                    piece, self.held = piece[:-keep], piece[-keep:]
            text += piece
            if len(self.out) >= p.max_tokens:
                self.finish = "length"
                break
        if eos or self.finish == "length":  # held text was not a stop string after all
            text += self.held + self.decoder.flush()
            self.held = ""
        return text, taken


@dataclass(slots=True)
class Stats:
    """Lifetime counters, read by /metrics and /get_server_info."""

    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    # prefix cache, in tokens (vLLM's prefix_cache_queries/hits): prompt tokens looked up,
    # and those reused instead of computed
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    forward_tokens: int = 0  # tokens through the main model's forward (prefill, decode, verify)

    def verified(self, k: int, accepted: int) -> None:
        """Count one verify step of one request: `k` drafts proposed, the first `accepted` kept."""
        self.spec_num_drafts += 1
        self.spec_num_draft_tokens += k
        self.spec_num_accepted_tokens += accepted
        for j in range(accepted):
            self.spec_accepted_per_pos[j] += 1

    @property
    def avg_spec_accept_length(self) -> float | None:
        if not self.spec_num_drafts:
            return None
        return 1.0 + self.spec_num_accepted_tokens / self.spec_num_drafts


def generator(params: SamplingParams) -> torch.Generator | None:
    """The random stream of a sampled request (None for greedy): seeded by its `seed`, else by
    a fresh draw; UserError for a seed torch refuses."""
    if params.greedy:
        return None
    gen = torch.Generator()
    try:
        gen.manual_seed(params.seed if params.seed is not None else
                        int(torch.randint(0, 2**62, ()).item()))
    except (RuntimeError, OverflowError, ValueError) as exc:
        raise UserError(f"seed {params.seed} is not usable: {exc}") from None
    return gen


def deliver(r: Request, ev: Event) -> bool:
    """Hand an event to a request's listener; a failing listener must not stop the engine."""
    try:
        r.callback(ev)
        return True
    except Exception:  # noqa: BLE001 - e.g. the server's event loop is gone
        traceback.print_exc()
        return False


def stop_prefix_len(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of text that is a proper prefix of some stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
