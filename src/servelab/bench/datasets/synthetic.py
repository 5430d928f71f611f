"""Random prompts of an exact length (SGLang's and vLLM's `random` dataset): every prompt drawn
independently, so that no two share a prefix and no prefix cache ever hits."""

from __future__ import annotations

import asyncio
import random

from servelab.bench.datasets.text import VOCAB, fit_prompt
from servelab.bench.workload import CountFn, RequestSpec


async def random_specs(input_len: int, output_len: int, total: int, rng: random.Random,
                       count: CountFn | None, concurrency: int, first: int = 0) -> list[RequestSpec]:
    """`total` prompts of `input_len` tokens (indices from `first`), each from its own seed."""
    seeds = [rng.getrandbits(64) for _ in range(total)]
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> RequestSpec:
        r = random.Random(seeds[i])
        if count is None:
            words = [r.choice(VOCAB) for _ in range(input_len)]
            return RequestSpec(first + i, " ".join(words), input_len, output_len, False)
        async with sem:
            prompt, n, exact = await fit_prompt(count, input_len, r)
        return RequestSpec(first + i, prompt, n, output_len, exact)

    return list(await asyncio.gather(*(one(i) for i in range(total))))
