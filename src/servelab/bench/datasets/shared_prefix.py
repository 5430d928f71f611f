"""Generated shared-prefix groups (SGLang's `--dataset-name generated-shared-prefix`): G groups of
P prompts; every prompt of a group starts with the group's system prompt of S tokens and ends
with a question of its own of Q tokens, all exact (each piece fitted on its own through
/tokenize, special tokens excluded; the pieces are joined by a space, which adds no token).
SGLang joins them with a blank line, which adds a token or two to every prompt.

The G x P requests are shuffled by the seed, as SGLang does unless --gsp-ordered; --num-prompts
does not apply (SGLang ignores it here too). The system prompt is what a prefix cache can reuse:
each spec carries its group and `prefix_len` (S plus the special tokens of the prompt start, 0
for the first request of its group).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from servelab.bench.datasets.text import fit_piece, special_tokens
from servelab.bench.workload import CountFn, RequestSpec


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """SGLang's --gsp-num-groups, --gsp-prompts-per-group, --gsp-system-prompt-len,
    --gsp-question-len, --gsp-output-len (the defaults are WorkloadConfig's, SGLang's own)."""

    num_groups: int
    prompts_per_group: int
    system_prompt_len: int
    question_len: int
    output_len: int

    @property
    def total(self) -> int:
        return self.num_groups * self.prompts_per_group


async def shared_prefix_specs(g: SharedPrefix, rng: random.Random, count: CountFn | None,
                              concurrency: int) -> list[RequestSpec]:
    """The G x P requests in a seeded random order."""
    special = await special_tokens(count)
    sem = asyncio.Semaphore(concurrency)
    seeds = [rng.getrandbits(64) for _ in range(g.num_groups * (1 + g.prompts_per_group))]

    async def piece(n: int, s: int, lead: str = "") -> tuple[str, int, bool]:
        async with sem:
            return await fit_piece(count, special, n, random.Random(s), lead)

    systems = await asyncio.gather(*(piece(g.system_prompt_len, seeds[k]) for k in range(g.num_groups)))
    pairs = [(k, j) for k in range(g.num_groups) for j in range(g.prompts_per_group)]
    rng.shuffle(pairs)
    first_of_group = {}
    for i, (k, _) in enumerate(pairs):
        first_of_group.setdefault(k, i)

    async def one(i: int, k: int, j: int) -> RequestSpec:
        q = await piece(g.question_len, seeds[g.num_groups + k * g.prompts_per_group + j], " ")
        prompt = systems[k][0] + " " + q[0]
        want = special + g.system_prompt_len + g.question_len
        n_in: int | None = want
        exact = False
        if count is not None:
            async with sem:
                n_in = await count(prompt)
            exact = systems[k][2] and q[2] and n_in == want
        # the group's first request sends its system prompt first: nothing to reuse yet
        shared = 0 if first_of_group[k] == i else special + g.system_prompt_len
        return RequestSpec(i, prompt, n_in, g.output_len, exact, prefix_group=k,
                           prefix_len=shared)

    return list(await asyncio.gather(*(one(i, k, j) for i, (k, j) in enumerate(pairs))))
