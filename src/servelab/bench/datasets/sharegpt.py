"""ShareGPT-format conversations: the first human turn as the prompt, the first reply's length
as the output length (SGLang's and vLLM's `sharegpt` dataset)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import orjson

from servelab.bench.datasets.text import special_tokens
from servelab.bench.workload import CountFn, RequestSpec
from servelab.errors import UserError


def sharegpt_pairs(path: str) -> list[tuple[str, str]]:
    """(first human turn, first reply) pairs of a ShareGPT-format JSON (list) or JSONL file."""
    raw = Path(path).read_bytes()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            data = [orjson.loads(line) for line in raw.splitlines() if line.strip()]
        except orjson.JSONDecodeError as exc:
            raise UserError(f"--dataset {path}: not JSON or JSONL ({exc})") from None
    if not isinstance(data, list):
        raise UserError(f"--dataset {path}: expected a list of conversations (ShareGPT format)")
    pairs: list[tuple[str, str]] = []
    for item in data:
        conv = item.get("conversations") or item.get("conversation") if isinstance(item, dict) else None
        if not isinstance(conv, list) or len(conv) < 2:
            continue
        turns = [(t.get("from") or t.get("role"), t.get("value") or t.get("content"))
                 for t in conv if isinstance(t, dict)]
        human = next((v for r, v in turns if r in ("human", "user") and v), None)
        reply = next((v for r, v in turns if r in ("gpt", "assistant", "chatgpt", "bard") and v), None)
        if isinstance(human, str) and isinstance(reply, str):
            pairs.append((human, reply))
    if not pairs:
        raise UserError(f"--dataset {path}: no conversation with a human turn and a reply "
                        "(ShareGPT format: [{\"conversations\": [{\"from\": \"human\", \"value\": ...}, ...]}])")
    return pairs


async def sharegpt_specs(path: str, total: int, rng: random.Random, count: CountFn | None,
                         concurrency: int) -> list[RequestSpec]:
    """`total` requests drawn from the file (shuffled by `rng`, cycling when it is short)."""
    pairs = sharegpt_pairs(path)
    rng.shuffle(pairs)
    chosen = [pairs[i % len(pairs)] for i in range(total)]
    # the counter includes special tokens (BOS) as the server counts a prompt; an output
    # length has none, so subtract what an empty text counts
    special = await special_tokens(count)
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> RequestSpec:
        prompt, reply = chosen[i]
        if count is None:
            n_in, n_out = len(prompt.split()), len(reply.split())
        else:
            async with sem:
                n_in, n_out = await count(prompt), await count(reply) - special
        return RequestSpec(i, prompt, n_in, max(1, n_out), count is not None)

    return list(await asyncio.gather(*(one(i) for i in range(total))))
