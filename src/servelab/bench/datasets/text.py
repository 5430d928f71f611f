"""Prompt text of an exact token count, shared by every dataset.

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

import functools
import random
from collections.abc import Callable
from pathlib import Path

from servelab.bench.workload import CountFn
from servelab.errors import UserError

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
        one = text + sep + w if text else w
        # twice too: from an empty text the first piece has no separator, so a byte-level
        # tokenizer's " a" (two tokens) would pass a one-piece test and fail every top-up
        if await count(one) == c + 1 and await count(one + sep + w) == c + 2:
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


def counter(remote: CountFn | None, tokenizer: str | None) -> tuple[CountFn | None, str]:
    """The token counter of a workload and how it counts: the server's /tokenize, else a local
    tokenizer file, else none ('approximate': one token per vocabulary word)."""
    if remote is not None:
        return remote, "server:/tokenize"
    if tokenizer:
        sync = local_counter(tokenizer)

        async def count(text: str) -> int:  # same signature as the remote counter
            return sync(text)

        return count, f"tokenizer:{tokenizer}"
    return None, "approximate"


async def special_tokens(count: CountFn | None) -> int:
    """What an empty text counts (BOS and the like): subtracted where a piece of a prompt, or an
    output, is counted on its own."""
    if count is None:
        return 0
    try:
        return await count("")
    except RuntimeError:  # a server that refuses an empty prompt: assume none
        return 0


async def fit_piece(count: CountFn | None, special: int, target: int,
                    rng: random.Random, lead: str = "") -> tuple[str, int, bool]:
    """A piece of a prompt (a block, a system prompt, a question) of `target` tokens counted on
    its own, special tokens excluded: (text, tokens, exact). `lead` is what precedes it in the
    prompt (a space), counted with it as in context: a BPE word with its space can be another
    token than the word alone. Without a counter: `target` words."""
    if count is None:
        return " ".join(rng.choice(VOCAB) for _ in range(target)), target, False

    async def bare(text: str) -> int:
        return await count(lead + text) - special

    if await bare("") == target:  # the lead alone is the piece (a byte-level tokenizer's space)
        return "", target, True
    return await fit_prompt(bare, target, rng)
