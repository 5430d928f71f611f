"""Prompts of a replayed trace, built from its block hashes so that the prefix-cache pattern of
the original traffic is kept: requests that share a hash_id get the identical text block there,
hence identical tokens.

Each block is text of exactly its token count (counted on its own through the /tokenize fitting
of `text.py`, special tokens excluded; the first block also leaves room for them), drawn from a
generator seeded by (seed, hash_id): the same id always gives the same words, and a shorter use
of an id (a trace's partial last block) gives a prefix of the same word stream. Blocks are joined
by a space: with the vocabulary's space-separated words, BPE tokenizers split at the space, so a
block's tokens do not depend on its neighbours (tests/bench/datasets check it through /tokenize
and with a byte-level BPE). A request without hash ids (Azure, BurstGPT) gets a prompt of its own.

Each finished prompt is counted once more as a whole: `input_len` is that count and
`input_len_exact` says whether it matches the trace's `input_length`.
"""

from __future__ import annotations

import asyncio
import hashlib
import random

from servelab.bench.datasets.text import fit_piece, fit_prompt, special_tokens
from servelab.bench.datasets.trace import TraceRow, TraceWindow
from servelab.bench.workload import CountFn, RequestSpec


def _seed(seed: int, *key: object) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, (seed, *key))).encode()).digest()[:8], "big")


def block_lengths(row: TraceRow, block_size: int) -> list[int]:
    """Tokens of each of the row's blocks: full blocks, the last one holding the rest (a trace
    whose hash ids and input length disagree is trusted for the length)."""
    n = len(row.hash_ids)
    out: list[int] = []
    left = row.input_len
    for i in range(n):
        k = left if i == n - 1 else min(block_size, left)
        if k <= 0:
            break
        out.append(k)
        left -= k
    return out


def sessions(rows: tuple[TraceRow, ...]) -> list[str | None]:
    """Each row's session: the first turn's chat id, followed through parent_chat_id (Bailian);
    None where the trace has no chats."""
    root: dict[int, int] = {}
    out: list[str | None] = []
    for r in rows:
        if r.chat_id is None:
            out.append(None)
            continue
        p = r.parent_chat_id
        root[r.chat_id] = root.get(p, p) if p is not None and p >= 0 else r.chat_id
        out.append(str(root[r.chat_id]))
    return out


async def trace_specs(win: TraceWindow, block_size: int, seed: int, count: CountFn | None,
                      concurrency: int) -> list[RequestSpec]:
    """One RequestSpec per row of the window, due at the row's time."""
    special = await special_tokens(count)
    sem = asyncio.Semaphore(concurrency)
    blocks: dict[tuple[int, int, bool], asyncio.Task[tuple[str, int, bool]]] = {}

    async def fit_block(h: int, n: int, first: bool) -> tuple[str, int, bool]:
        async with sem:
            # the first block holds the special tokens (BOS) the server adds to every prompt
            return await fit_piece(count, special, max(1, n - special) if first else n,
                                   random.Random(_seed(seed, "block", h)), "" if first else " ")

    def block(h: int, n: int, first: bool) -> asyncio.Task[tuple[str, int, bool]]:
        key = (h, n, first)
        if key not in blocks:  # one fit per distinct block, however many requests share it
            blocks[key] = asyncio.ensure_future(fit_block(h, n, first))
        return blocks[key]

    seen: dict[int, int] = {}  # hash id -> the longest use of it so far (tokens)
    shared: list[int] = []  # tokens of leading blocks an earlier request already sent
    for r in win.rows:
        k = 0
        lens = block_lengths(r, block_size)
        for h, n in zip(r.hash_ids, lens, strict=False):
            if h not in seen:
                break
            k += min(n, seen[h])  # a longer use shares only what was sent before
            if n > seen[h]:
                break
        shared.append(k)
        for h, n in zip(r.hash_ids, lens, strict=False):
            seen[h] = max(seen.get(h, 0), n)
    sess = sessions(win.rows)

    async def one(i: int, r: TraceRow) -> RequestSpec:
        lens = block_lengths(r, block_size)
        if lens:
            parts = await asyncio.gather(*(block(h, n, j == 0)
                                           for j, (h, n) in enumerate(zip(r.hash_ids, lens, strict=False))))
            prompt = " ".join(p[0] for p in parts)
            exact = all(p[2] for p in parts)
        else:
            rng = random.Random(_seed(seed, "row", i))
            if count is None:
                prompt, _, exact = await fit_piece(None, 0, r.input_len, rng)
            else:
                async with sem:
                    prompt, _, exact = await fit_prompt(count, r.input_len, rng)
        n_in: int | None = r.input_len
        if count is not None:
            async with sem:
                n_in = await count(prompt)
            exact = exact and n_in == r.input_len
        else:
            exact = False
        return RequestSpec(i, prompt, n_in, max(1, r.output_len), exact,
                           arrival_s=win.arrivals_s[i], session_id=sess[i], turn=r.turn,
                           prefix_group=r.hash_ids[0] if r.hash_ids else None,
                           prefix_len=shared[i] if r.hash_ids else None)

    return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(win.rows))))
