"""The workload data model: what a load point sends, request by request.

A workload is a list of `RequestSpec`s built by one of the datasets in `servelab.bench.datasets`
(random lengths, ShareGPT, a replayed trace, generated shared-prefix groups). Every dataset fills
the same record; what a field means does not depend on where it came from:

- the prompt (text) and its token count as measured (`input_len`; exact when a tokenizer counted
  it), and the output length asked (`output_len`, sent as max_tokens + ignore_eos);
- `arrival_s`: when it is due, seconds after the load point starts, on the workload's own clock
  (a trace's timestamps, scaled and shifted); None when the load point decides (closed loop,
  Poisson): a replay load point (`LoadPoint()`, key "replay") sends every request at its time;
- `session_id` and `turn`: the conversation a request belongs to and its 1-based turn, where the
  source says (a Bailian trace's chat ids and turns; multi-turn workloads); None otherwise;
  `session_turns`: how many turns its session plans to send (multi-turn workloads), so that a
  session cut short (a failed turn, --max-duration) is told from a finished one;
- `history`: the conversation before `prompt` as (role, content) messages, sent as chat
  messages (`--api chat`); a multi-turn session fills it when it sends a turn, with the server's
  own earlier answers (on the completions API the transcript is the prompt instead);
- `prefix_group` and `prefix_len`: the group of requests sharing a prefix, and how many of this
  prompt's first tokens an earlier request of the workload already sent (a shared-prefix
  group's system prompt after the group's first request; in a trace with hash_ids, the leading
  blocks seen before): what a perfect prefix cache could reuse, the reference for the cached
  tokens the server reports (docs/METRICS.md).

This module only defines the records; it imports nothing else of servelab, so that the client,
the load drivers, the metrics and the datasets can all read it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

CountFn = Callable[[str], Awaitable[int]]
# between a session's answer and its next user text in a completions transcript (the chat API
# sends messages instead): one newline, a token of its own in BPE vocabularies, so that the
# new text's tokens do not depend on how the answer ended
TURN_SEP = "\n"


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send: the prompt, its token count as measured, the output length asked,
    and where it sits in time, in a session and in a shared-prefix group (module docstring)."""

    index: int
    prompt: str
    input_len: int | None
    output_len: int
    input_len_exact: bool
    arrival_s: float | None = None
    session_id: str | None = None
    turn: int | None = None
    prefix_group: int | None = None
    prefix_len: int | None = None
    session_turns: int | None = None
    history: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Workload:
    """The requests of a load point (`warmup` first, excluded from metrics), how input lengths
    were counted ('server:/tokenize', 'tokenizer:<path>' or 'approximate') and what the dataset
    wants the summary to say about itself (`info`: e.g. a trace's format, window and rows)."""

    requests: tuple[RequestSpec, ...]
    warmup: tuple[RequestSpec, ...]
    input_len_source: str
    info: dict | None = None

    @property
    def input_len_exact(self) -> bool:
        return all(r.input_len_exact for r in self.requests)

    @property
    def timed(self) -> bool:
        """True when every request carries its own arrival time (a trace)."""
        return bool(self.requests) and all(r.arrival_s is not None for r in self.requests)
