"""ShareGPT-format conversations: the first human turn as the prompt, the first reply's length
as the output length (SGLang's and vLLM's `sharegpt` dataset); or, for multi-turn sessions
(datasets/sessions.py), every turn of a conversation in order (`sharegpt_conversations`)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import orjson

from servelab.bench.datasets.text import special_tokens
from servelab.bench.workload import CountFn, RequestSpec
from servelab.errors import UserError

_REPLY = ("gpt", "assistant", "chatgpt", "bard")


def _items(path: str) -> list:
    """The conversations of a ShareGPT-format JSON (list) or JSONL file, unchecked."""
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
    return data


def _turns(item: object) -> list[tuple[object, object]] | None:
    conv = item.get("conversations") or item.get("conversation") if isinstance(item, dict) else None
    if not isinstance(conv, list) or len(conv) < 2:
        return None
    return [(t.get("from") or t.get("role"), t.get("value") or t.get("content"))
            for t in conv if isinstance(t, dict)]


def sharegpt_conversations(path: str) -> list[list[tuple[str, str]]]:
    """Each conversation of the file as its (human turn, the reply that follows it) pairs, in
    order: a conversation that opens with a reply (a system greeting) starts at its first human
    turn, and a human turn without a reply after it ends the conversation (its answer length is
    unknown). Conversations without a single pair are left out."""
    out: list[list[tuple[str, str]]] = []
    for item in _items(path):
        turns = _turns(item) or []
        pairs: list[tuple[str, str]] = []
        i = next((j for j, (r, _) in enumerate(turns) if r in ("human", "user")), len(turns))
        while i + 1 < len(turns):
            (r1, v1), (r2, v2) = turns[i], turns[i + 1]
            if not (r1 in ("human", "user") and r2 in _REPLY and isinstance(v1, str) and v1
                    and isinstance(v2, str) and v2):
                break  # two human turns in a row, an empty turn: the conversation ends here
            pairs.append((v1, v2))
            i += 2
        if pairs:
            out.append(pairs)
    if not out:
        raise UserError(f"--dataset {path}: no conversation with a human turn followed by a reply "
                        "(ShareGPT format: [{\"conversations\": [{\"from\": \"human\", \"value\": ...}, "
                        "{\"from\": \"gpt\", \"value\": ...}, ...]}])")
    return out


def sharegpt_pairs(path: str) -> list[tuple[str, str]]:
    """(first human turn, first reply) pairs of a ShareGPT-format JSON (list) or JSONL file."""
    pairs: list[tuple[str, str]] = []
    for item in _items(path):
        turns = _turns(item)
        if turns is None:
            continue
        human = next((v for r, v in turns if r in ("human", "user") and v), None)
        reply = next((v for r, v in turns if r in _REPLY and v), None)
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
