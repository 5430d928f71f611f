"""Request specs: fixed lengths with exact input token counts, or a ShareGPT-format dataset.

Exact input lengths need the model's tokenizer. In order of preference we count tokens with the
server's `/tokenize` (SGLang and vLLM both serve it; the count includes special tokens such as BOS
exactly as the server will count the prompt), a local HF `tokenizers` file (`--tokenizer`), or,
with neither, we assume one token per word of a vocabulary of common English words and flag the
lengths as approximate (`input_len_exact = False`).

A prompt of N tokens is fitted by search: random words from the vocabulary, counted, then words
added or removed until the count is N (a few counts per prompt); where word granularity cannot
hit N, single-character filler words close the gap. Everything is drawn from `random.Random(seed)`
so the same seed gives the same prompts.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from servelab.bench.config import WorkloadConfig
from servelab.errors import UserError

CountFn = Callable[[str], Awaitable[int]]

# Common English words: single tokens in the usual BPE vocabularies (GPT-2, Llama, Qwen, DeepSeek)
# when preceded by a space, so a first guess of one word per token is close.
VOCAB = tuple(dict.fromkeys((
    "the of and to in is was for that on as with by he it at from his an were are which this be "
    "has had or one not but their first new after also they who its two her been other when there "
    "all during into school time may years more most only over city some world would where later up "
    "such used many can state about national out known university united then made season team "
    "year well under part three south both between including film house number north early high "
    "second company music after each group four name while through people since system series "
    "area five game river family life water until work government air book day war life war west "
    "east line long game end place head light power point road side story town way word young"
).split()))
FILLERS = ("a", "I", "x", "y", "z", "o", "e", "u")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send: the prompt, its token count as measured, the output length asked."""

    index: int
    prompt: str
    input_len: int | None
    output_len: int
    input_len_exact: bool


@dataclass(frozen=True, slots=True)
class Workload:
    """The requests of a load point (`warmup` first, excluded from metrics) and how input
    lengths were counted: 'server:/tokenize', 'tokenizer:<path>' or 'approximate'."""

    requests: tuple[RequestSpec, ...]
    warmup: tuple[RequestSpec, ...]
    input_len_source: str

    @property
    def input_len_exact(self) -> bool:
        return all(r.input_len_exact for r in self.requests)


@functools.lru_cache(maxsize=4)
def local_counter(path: str) -> Callable[[str], int]:
    """Token counter from an HF `tokenizers` file (tokenizer.json, or a folder holding one).
    Cached per path: each load point needs it twice (prompts, then output counts) and would
    otherwise parse the file both times."""
    from tokenizers import Tokenizer

    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    try:
        tok = Tokenizer.from_file(str(p))
    except Exception as exc:  # tokenizers raises a plain Exception on a bad file
        raise UserError(f"--tokenizer {path}: cannot load an HF tokenizers file ({exc})") from None
    return lambda text: len(tok.encode(text).ids)


async def fit_prompt(count: CountFn, target: int, rng: random.Random,
                     max_rounds: int = 16) -> tuple[str, int, bool]:
    """A prompt whose token count is `target` when possible: (prompt, counted_len, exact).

    Random words are bisected on the word count (proportional guesses first), then the last few
    tokens are topped up with a filler word found to add exactly one token."""
    pool: list[str] = []
    seen: dict[int, int] = {}

    async def words(n: int) -> int:
        while len(pool) < n:
            pool.append(rng.choice(VOCAB))
        if n not in seen:
            seen[n] = await count(" ".join(pool[:n]))
        return seen[n]

    lo, hi = 0, None  # largest word count known <= target, smallest known > target
    n = max(1, target)
    for _ in range(max_rounds):
        c = await words(n)
        if c == target:
            return " ".join(pool[:n]), c, True
        if c < target:
            lo = max(lo, n)
        else:
            hi = n if hi is None else min(hi, n)
        if hi is not None and hi - lo <= 1:
            break
        guess = round(n * target / c) if c > 0 else 2 * n
        if guess == n:
            guess = n + (1 if c < target else -1)
        if hi is not None and not lo < guess < hi:
            guess = (lo + hi) // 2
        n = max(1, guess)
    text = " ".join(pool[:lo])
    c = seen[lo] if lo else await count("")
    closest = min(seen, key=lambda k: (abs(seen[k] - target), k))
    if c > target:  # even the empty prompt counts more (special tokens)
        return " ".join(pool[:closest]), seen[closest], False
    # A piece that adds exactly one token to this text: a word (BPE-style tokenizers), else a
    # single character glued on (byte-level tokenizers, where every word with its space is >= 2).
    pieces = [(" ", w) for w in FILLERS + VOCAB[:24]] + [("", ch) for ch in ".x0"]
    unit: tuple[str, str] | None = None
    for sep, w in pieces:
        if await count(text + sep + w if text else w) == c + 1:
            unit = (sep, w)
            break
    if unit is None:
        return " ".join(pool[:closest]), seen[closest], False
    sep, w = unit
    k = target - c
    for _ in range(6):
        cand = (text + sep if text else "") + sep.join([w] * k) if k > 0 else text
        got = await count(cand)
        if got == target:
            return cand, got, True
        k += target - got
        if k < 0:
            break
    return " ".join(pool[:closest]), seen[closest], False


def _sharegpt_pairs(path: str) -> list[tuple[str, str]]:
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


async def build_workload(cfg: WorkloadConfig, warmup: int, remote_count: CountFn | None,
                         concurrency: int = 32) -> Workload:
    """The request specs of a run: `cfg.num_prompts` measured requests plus `warmup` more."""
    source = "approximate"
    count: CountFn | None = None
    if remote_count is not None:
        count, source = remote_count, "server:/tokenize"
    elif cfg.tokenizer:
        sync = local_counter(cfg.tokenizer)

        async def count(text: str) -> int:  # same signature as the remote counter
            return sync(text)

        source = f"tokenizer:{cfg.tokenizer}"
    rng = random.Random(cfg.seed)
    total = cfg.num_prompts + warmup
    sem = asyncio.Semaphore(concurrency)

    if cfg.dataset:
        pairs = _sharegpt_pairs(cfg.dataset)
        rng.shuffle(pairs)
        chosen = [pairs[i % len(pairs)] for i in range(total)]  # cycles when the file is short
        # the counter includes special tokens (BOS) as the server counts a prompt; an output
        # length has none, so subtract what an empty text counts
        special = 0
        if count is not None:
            try:
                special = await count("")
            except RuntimeError:  # a server that refuses an empty prompt: assume none
                special = 0

        async def one_ds(i: int) -> RequestSpec:
            prompt, reply = chosen[i]
            if count is None:
                n_in, n_out = len(prompt.split()), len(reply.split())
            else:
                async with sem:
                    n_in, n_out = await count(prompt), await count(reply) - special
            return RequestSpec(i, prompt, n_in, max(1, n_out), count is not None)

        specs = await asyncio.gather(*(one_ds(i) for i in range(total)))
    else:
        seeds = [rng.getrandbits(64) for _ in range(total)]

        async def one(i: int) -> RequestSpec:
            r = random.Random(seeds[i])
            if count is None:
                words = [r.choice(VOCAB) for _ in range(cfg.input_len)]
                return RequestSpec(i, " ".join(words), cfg.input_len, cfg.output_len, False)
            async with sem:
                prompt, n, exact = await fit_prompt(count, cfg.input_len, r)
            return RequestSpec(i, prompt, n, cfg.output_len, exact)

        specs = await asyncio.gather(*(one(i) for i in range(total)))
    # warmup requests come last in the draw so that measured prompts do not depend on --warmup
    measured = tuple(specs[: cfg.num_prompts])
    warm = tuple(specs[cfg.num_prompts:])
    return Workload(requests=measured, warmup=warm, input_len_source=source)
