"""Random prompts of an exact length (SGLang's and vLLM's `random` dataset): every prompt drawn
independently, so that no two share a prefix and no prefix cache ever hits."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from servelab.bench.datasets.text import VOCAB, fit_prompt
from servelab.bench.workload import CountFn, RequestSpec


async def _random_prompts(lengths: Sequence[tuple[int, int]], rng: random.Random,
                          count: CountFn | None, concurrency: int, first: int
                          ) -> list[RequestSpec]:
    """One random prompt per (input tokens, output tokens), each from its own seed."""
    seeds = [rng.getrandbits(64) for _ in lengths]
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> RequestSpec:
        r = random.Random(seeds[i])
        n_in, n_out = lengths[i]
        if count is None:
            words = [r.choice(VOCAB) for _ in range(n_in)]
            return RequestSpec(first + i, " ".join(words), n_in, n_out, False)
        async with sem:
            prompt, n, exact = await fit_prompt(count, n_in, r)
        return RequestSpec(first + i, prompt, n, n_out, exact)

    return list(await asyncio.gather(*(one(i) for i in range(len(lengths)))))


async def random_specs(input_len: int, output_len: int, total: int, rng: random.Random,
                       count: CountFn | None, concurrency: int, first: int = 0) -> list[RequestSpec]:
    """`total` prompts of `input_len` tokens (indices from `first`), each from its own seed."""
    return await _random_prompts([(input_len, output_len)] * total, rng, count, concurrency, first)


async def random_like(like: Sequence[RequestSpec], total: int, rng: random.Random,
                      count: CountFn | None, concurrency: int, first: int = 0
                      ) -> list[RequestSpec]:
    """`total` random prompts whose (input, output) lengths are drawn from `like`'s: warm-up
    prompts with a dataset's length distribution that share none of its text."""
    picks = [rng.choice(like) for _ in range(total)]
    lengths = [(max(1, s.input_len or 1), s.output_len) for s in picks]
    return await _random_prompts(lengths, rng, count, concurrency, first)
