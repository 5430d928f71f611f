"""Multi-turn sessions, planned: one RequestSpec per turn of each session, carrying the turn's
NEW user text as `prompt` (its own token count as `input_len`, special tokens excluded), the
answer length asked, the session's id, the 1-based turn and the session's turn count. What
each turn sends, the history and the server's own earlier answers, is only known while the
session runs: servelab.bench.sessions builds it then.

- From a ShareGPT file: `num_sessions` conversations drawn by the seed (cycling when the file
  has fewer), each with its human turns in order, at most `max_turns` of them; a turn asks
  for as many tokens as the dataset's reply had (the reply's text is never sent: the server's
  own answer is).
- Synthetic (no file): `num_sessions` x `turns` turns (at most `max_turns`), each adding exactly
  `input_len` tokens of new user text (fitted on its own through /tokenize, after the
  transcript's turn separator) and asking `output_len`: no dataset file needed, for tests and
  the embedded engine.
"""

from __future__ import annotations

import asyncio
import random

from servelab.bench.config import SessionsConfig
from servelab.bench.datasets.sharegpt import sharegpt_conversations
from servelab.bench.datasets.text import fit_piece, special_tokens
from servelab.bench.workload import TURN_SEP, CountFn, RequestSpec


async def session_specs(cfg: SessionsConfig, input_len: int, output_len: int,
                        dataset: str | None, rng: random.Random, count: CountFn | None,
                        concurrency: int) -> list[RequestSpec]:
    """Every planned turn of every session, session after session, turns in order."""
    cap = cfg.max_turns or 1 << 30
    special = await special_tokens(count)
    sem = asyncio.Semaphore(concurrency)
    plan: list[tuple[int, int, int, str | int, str | None]] = []  # session, turn, of, text|seed, reply
    if dataset is not None:
        convs = sharegpt_conversations(dataset)
        rng.shuffle(convs)
        for k in range(cfg.num_sessions):
            turns = convs[k % len(convs)][:cap]
            plan += [(k, j, len(turns), q, a) for j, (q, a) in enumerate(turns)]
    else:
        n = min(cfg.turns, cap)
        plan += [(k, j, n, rng.getrandbits(64), None) for k in range(cfg.num_sessions)
                 for j in range(n)]

    async def one(i: int, k: int, j: int, of: int, text: str | int, reply: str | None) -> RequestSpec:
        lead = "" if j == 0 else TURN_SEP
        if isinstance(text, int):  # synthetic: fit new text of exactly input_len tokens
            async with sem:
                prompt, n_in, exact = await fit_piece(count, special, input_len,
                                                      random.Random(text), lead)
            n_out = output_len
        else:
            prompt, exact = text, count is not None
            assert reply is not None
            if count is None:
                n_in, n_out = len(text.split()), len(reply.split())
            else:
                async with sem:
                    n_in = await count(lead + text) - special
                    n_out = await count(reply) - special
        # a session is its own prefix group: turn 1 shares nothing, turn k its history
        # (the driver sets prefix_len then, from the server's count of turn k-1's prompt)
        return RequestSpec(i, prompt, n_in, max(1, n_out), exact, session_id=str(k), turn=j + 1,
                           session_turns=of, prefix_group=k, prefix_len=0)

    return list(await asyncio.gather(*(one(i, *p) for i, p in enumerate(plan))))
