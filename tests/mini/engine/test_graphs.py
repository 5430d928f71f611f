"""CUDA graphs (engine/graphs.py): the padded static-buffer path gives the eager path's tokens,
and capture orders the static inputs' fills before the side stream's warm-up (simulated
streams on the CPU)."""

from __future__ import annotations

import torch
from mini_engines import GREEDY, PROMPTS, engine, run_all

from servelab.mini.engine.graphs import GraphRunner
from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.model import tokenizer as tk


def test_graph_runner_padding_matches_eager():
    prompts = [tk.encode(p) for p in PROMPTS]
    params = [SamplingParams(max_tokens=30, **GREEDY)] * 4
    ref = run_all(engine(max_running_requests=4, speculative_algorithm="EAGLE"), prompts, params)
    eng = engine(max_running_requests=4, speculative_algorithm="EAGLE")
    eng.graphs = GraphRunner(eng, max_tokens=8)  # CPU: static buffers + padding, no capture
    eng.graphs.capture()
    assert run_all(eng, prompts, params) == ref


class _FakeStream:
    """A CUDA stream as the capture code sees it: work queued on it runs only once another
    stream waits on it (or the device synchronizes), like an unordered GPU stream."""

    def __init__(self) -> None:
        self.pending: list = []

    def flush(self) -> None:
        while self.pending:
            self.pending.pop(0)()

    def wait_stream(self, other: _FakeStream) -> None:
        other.flush()


def test_graph_capture_orders_input_fills_before_side_stream(monkeypatch):
    """CUDA graph capture on a simulated stream model: the static inputs are filled on the
    current stream, and the warm-up runs on a side stream. Unless the side stream waits for the
    fills it reads the allocator's stale bytes as slots/positions: the H200 run of the `naive`
    backend died that way (index_copy_ out of bounds in the capture warm-up). The warm-up must
    write only the scratch slot's rows."""
    eng = engine(max_running_requests=2)
    default = _FakeStream()
    stack = [default]

    class _Ctx:
        def __init__(self, s):
            self.s = s

        def __enter__(self):
            stack.append(self.s)

        def __exit__(self, *exc):
            stack.pop()

    def sync():
        for s in streams:
            s.flush()

    streams = [default]

    def new_stream():
        s = _FakeStream()
        streams.append(s)
        return s

    class _Graph:
        def pool(self):
            return None

        def replay(self):
            pass

    class _GraphCtx:
        def __init__(self, g, pool=None):
            pass

        def __enter__(self):
            sync()  # torch.cuda.graph synchronizes before capturing

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", new_stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stack[-1])
    monkeypatch.setattr(torch.cuda, "stream", _Ctx)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", _GraphCtx)
    monkeypatch.setattr(torch.cuda, "synchronize", sync)

    runner = GraphRunner(eng, max_tokens=4)
    real_inputs = GraphRunner._inputs
    cpu, fake_cuda = eng.device, torch.device("cuda")

    def stale_inputs(self, n):
        """The real buffers, holding stale bytes until the current stream runs the fills."""
        eng.device = cpu
        try:
            x = real_inputs(self, n)
        finally:
            eng.device = fake_cuda
        final = {k: v.clone() for k, v in x.items()}
        for v in x.values():
            v.fill_(10**6)
        stack[-1].pending.append(lambda: [x[k].copy_(final[k]) for k in x])
        return x

    monkeypatch.setattr(GraphRunner, "_inputs", stale_inputs)
    eng.device = fake_cuda
    try:
        runner.capture()
    finally:
        eng.device = cpu
    assert {k for k, _ in runner.graphs} == {"main"} and len(runner.graphs) == len(runner.buckets)
    live = eng.cache.slots * eng.ctx  # rows of the real slots; the scratch slot follows
    for kv, ik in zip(eng.cache.kv, eng.cache.ik, strict=True):
        assert not kv[:live].any() and not ik[:live].any()
    assert all(kv[live:].any() for kv in eng.cache.kv[:-1])  # main layers wrote scratch rows


def test_graph_runner_with_reused_prefixes_matches_eager_without():
    """A prompt whose prefix is cached computes a few tokens: small enough for the graphs, at
    positions past the copied rows (the graph's candidates are the whole slot)."""
    system = "import os\nimport sys\n" * 3
    prompts = [tk.encode(system + p) for p in PROMPTS]
    params = [SamplingParams(max_tokens=20, **GREEDY)] * 4
    spec = {"speculative_algorithm": "EAGLE"}
    ref = [run_all(engine(disable_radix_cache=True, **spec), [p], [sp])[0]
           for p, sp in zip(prompts, params, strict=True)]
    eng = engine(max_running_requests=4, **spec)
    eng.graphs = GraphRunner(eng, max_tokens=32)
    eng.graphs.capture()
    assert [run_all(eng, [p], [sp])[0] for p, sp in zip(prompts, params, strict=True)] == ref
    assert eng.stats.prefix_cache_hits >= 48 * 3
