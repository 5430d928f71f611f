"""The session driver: N sessions in flight (a closed loop of sessions) or sessions starting on
a Poisson/gamma schedule (an open loop of sessions), each sending its turns in order.

Turn k sends the conversation so far: turns 1..k-1 of the user and the answers the server
actually streamed back for them (never the dataset's replies), then turn k's new text. On the
chat API they go as messages (`RequestSpec.history`); on the completions and SGLang APIs as one
transcript: turn k-1's prompt, its answer, the turn separator, turn k's text, so that each
prompt extends the previous one and a prefix cache can reuse it. A session waits its think time
between an answer and its next turn, and keeps its slot meanwhile (a user thinking is still a
user). A failed turn ends its session (there is no answer to continue from); so does the
deadline (--max-duration): no new turn starts after it.

Think times are drawn from a generator seeded by (seed, session), and open-loop start times
from the seed, so every arm and repetition of a load point replays the same pauses whatever
the order the sessions run in.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from servelab.bench.client import RawResult
from servelab.bench.config import LoadPoint, ThinkTime
from servelab.bench.load import arrival_offsets_s, on_schedule
from servelab.bench.workload import TURN_SEP, RequestSpec

Send = Callable[[RequestSpec], Awaitable[RawResult]]
OnDone = Callable[[RawResult], None]


def _seed(seed: int, *key: object) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, (seed, *key))).encode()).digest()[:8],
                          "big")


def answer_text(r: RawResult) -> str:
    """What the server streamed back, as it streamed it."""
    return "".join(e[2] for e in r.events)


def turn_spec(planned: RequestSpec, chat: bool, history: tuple[tuple[str, str], ...],
              transcript: str, prev_prompt_tokens: int | None) -> RequestSpec:
    """What turn `planned` sends after the conversation so far: on the chat API the history
    as messages and the new text as the user message; otherwise the transcript so far (the
    previous prompt and its answer), the separator and the new text. `prefix_len` is the
    previous prompt's token count as the server reported it: a prefix of this prompt, what a
    cache of prompts could reuse. Only the first turn's input length is known beforehand."""
    first = planned.turn == 1
    if chat:
        sent = replace(planned, history=history)
    else:
        sent = replace(planned, prompt=planned.prompt if first
                       else transcript + TURN_SEP + planned.prompt)
    if first:
        return sent
    return replace(sent, input_len=None, input_len_exact=False, prefix_len=prev_prompt_tokens)


def group_sessions(specs: Sequence[RequestSpec]) -> list[list[RequestSpec]]:
    """The planned turns by session (in the order sessions first appear), turns in order."""
    by: dict[str, list[RequestSpec]] = {}
    for s in specs:
        assert s.session_id is not None and s.turn is not None, "a session turn needs both"
        by.setdefault(s.session_id, []).append(s)
    return [sorted(v, key=lambda s: s.turn or 0) for v in by.values()]


async def run_sessions(specs: Sequence[RequestSpec], load: LoadPoint, chat: bool, send: Send,
                       think: ThinkTime, seed: int, deadline_ns: int | None = None,
                       on_done: OnDone | None = None) -> tuple[list[RawResult], list[RequestSpec]]:
    """Run every session at the load point: `concurrency` sessions in flight, or sessions
    starting at `request_rate` per second. The results of every turn sent, and the specs as
    sent (their prompts and histories), in send order."""
    sessions = group_sessions(specs)
    results: list[RawResult] = []
    sent: list[RequestSpec] = []

    def late() -> bool:
        return deadline_ns is not None and time.perf_counter_ns() >= deadline_ns

    async def session(turns: list[RequestSpec], due_ns: int | None = None) -> None:
        rng = random.Random(_seed(seed, "think", turns[0].session_id))
        history: tuple[tuple[str, str], ...] = ()
        transcript = ""
        prev: int | None = None
        for k, planned in enumerate(turns):
            if k:
                pause = think.draw(rng)
                if pause > 0:
                    await asyncio.sleep(pause)
            if late():
                return
            spec = turn_spec(planned, chat, history, transcript, prev)
            sent.append(spec)
            r = await send(spec)
            if k == 0 and due_ns is not None:
                r.t_due_ns = due_ns  # an open loop's dispatch lag: when the session started
            results.append(r)
            if on_done:
                on_done(r)
            if r.error is not None:
                return
            answer = answer_text(r)
            history = (*history, ("user", planned.prompt), ("assistant", answer))
            transcript = spec.prompt + answer
            prev = r.prompt_tokens

    if load.concurrency is not None:
        it = iter(sessions)

        async def worker() -> None:
            for turns in it:  # one shared iterator: each session is taken by one worker
                if late():
                    return
                await session(turns)

        await asyncio.gather(*(worker() for _ in range(min(load.concurrency, len(sessions)))))
    else:
        rate = load.request_rate if load.request_rate is not None else float("inf")
        offs = arrival_offsets_s(len(sessions), rate, load.burstiness, seed)
        await on_schedule(sessions, offs, time.perf_counter_ns(), deadline_ns, session)
    by_index = {s.index: s for s in sent}
    order = sorted(range(len(results)), key=lambda i: results[i].t_start_ns)
    return [results[i] for i in order], [by_index[results[i].index] for i in order]
