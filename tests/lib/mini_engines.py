"""Small engines for the engine tests (tests/mini/engine, tests/mini/model): build one on the
`micro` config (random weights) or `tiny` (the shipped checkpoint), and run requests through it
in the test's thread."""

from __future__ import annotations

from servelab.mini.engine.args import EngineArgs
from servelab.mini.engine.engine import Engine
from servelab.mini.engine.sampling import SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True)
PROMPTS = ["def f(x):\n    return", "import os\n", "class A:\n    pass\n" * 3, "x = [1, 2, 3]"]


def run_all(eng: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    """Submit all at once (continuous batching), step until done; token ids per request."""
    out: dict[int, list[int]] = {}
    done: set[int] = set()
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        out[i] = []

        def cb(ev, i=i):
            out[i].extend(ev.token_ids)
            if ev.finish_reason:
                done.add(i)

        eng.submit(p, sp, cb)
    while len(done) < len(prompts):
        assert eng.step(), "engine idle with unfinished requests"
    return [out[i] for i in range(len(prompts))]


def engine(config: str = "micro", **kw) -> Engine:
    kw.setdefault("random_weights", config == "micro")
    kw.setdefault("context_length", 256)
    return Engine(EngineArgs(config=config, **kw))
