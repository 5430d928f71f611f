"""Engine behaviour: speculative decoding reproduces greedy decoding exactly, batching and
queueing do not change any request's output, sampling controls (stop, min_tokens, ignore_eos,
max_tokens, seed) behave, and the speculative acceptance rule samples the target distribution."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest
import torch

from servelab.mini.engine.args import EngineArgs
from servelab.mini.engine.engine import Engine
from servelab.mini.engine.graphs import GraphRunner
from servelab.mini.engine.sampling import SamplingParams, accept_drafts
from servelab.mini.model import tokenizer as tk

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


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def engine(config: str = "micro", **kw) -> Engine:
    kw.setdefault("random_weights", config == "micro")
    kw.setdefault("context_length", 256)
    return Engine(EngineArgs(config=config, **kw))


@pytest.mark.parametrize("config", ["micro", "tiny"])
@pytest.mark.parametrize("steps", [1, 3])
def test_speculative_greedy_equals_greedy(config, steps):
    prompts = [tk.encode(p) for p in PROMPTS]
    params = [SamplingParams(max_tokens=n, **GREEDY) for n in (40, 33, 47, 21)]
    ref = run_all(engine(config, max_running_requests=4), prompts, params)
    spec = engine(config, max_running_requests=4, speculative_algorithm="EAGLE",
                  speculative_num_steps=steps)
    got = run_all(spec, prompts, params)
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert a == b, f"request {i}: differs from token {_first_diff(a, b)} on"
    st = spec.stats
    assert st.spec_num_draft_tokens == steps * st.spec_num_drafts
    assert sum(st.spec_accepted_per_pos) == st.spec_num_accepted_tokens
    # every verify step yields 1 + accepted tokens; the first token comes from prefill
    produced = sum(len(x) for x in got)
    assert produced <= st.spec_num_drafts + st.spec_num_accepted_tokens + len(prompts)
    if config == "tiny":  # the trained MTP head must actually be accepted
        assert st.avg_spec_accept_length > 1.3


def test_batching_and_queueing_do_not_change_outputs():
    prompts = [tk.encode(p) for p in PROMPTS + ["while True:", "# comment\n" * 5]]
    params = [SamplingParams(max_tokens=10 + 7 * i, **GREEDY) for i in range(len(prompts))]
    alone = [run_all(engine(max_running_requests=1), [p], [sp])[0]
             for p, sp in zip(prompts, params, strict=True)]
    eng = engine(max_running_requests=2)  # 6 requests, 2 slots: 4 wait in the queue
    assert run_all(eng, prompts, params) == alone
    assert eng.num_running == 0 and eng.num_waiting == 0
    assert sorted(eng._free) == [0, 1]


def test_graph_runner_padding_matches_eager():
    prompts = [tk.encode(p) for p in PROMPTS]
    params = [SamplingParams(max_tokens=30, **GREEDY)] * 4
    ref = run_all(engine(max_running_requests=4, speculative_algorithm="EAGLE"), prompts, params)
    eng = engine(max_running_requests=4, speculative_algorithm="EAGLE")
    eng.graphs = GraphRunner(eng, max_tokens=8)  # CPU: static buffers + padding, no capture
    eng.graphs.capture()
    assert run_all(eng, prompts, params) == ref


def test_stop_strings_min_tokens_and_max_tokens():
    eng = engine("tiny")
    p = tk.encode("import os\nimport sys\n\n\ndef main(argv):\n")
    ids, text, ev = eng.generate(p, SamplingParams(max_tokens=60, **GREEDY))
    assert len(ids) == 60 and ev.finish_reason == "length" and ev.completion_tokens == 60
    assert text == tk.decode(ids)
    stop = text[20:23]  # a string that greedy decoding will produce
    cut = text.find(stop)
    _, text2, ev2 = eng.generate(p, SamplingParams(max_tokens=60, stop=(stop,), **GREEDY))
    assert ev2.finish_reason == "stop" and text2 == text[:cut]
    # EOS: forbidden before min_tokens, allowed after (unless ignore_eos)
    ids3, _, ev3 = eng.generate([tk.BOS], SamplingParams(max_tokens=40, temperature=0.0,
                                                         min_tokens=40))
    assert tk.EOS not in ids3 and len(ids3) == 40


def test_seeded_sampling_is_reproducible():
    eng = engine("tiny")
    p = tk.encode("def main(")
    sp = SamplingParams(max_tokens=30, temperature=0.9, top_p=0.9, seed=7)
    a = eng.generate(p, sp)[0]
    b = eng.generate(p, sp)[0]
    c = eng.generate(p, SamplingParams(max_tokens=30, temperature=0.9, top_p=0.9, seed=8))[0]
    assert a == b and a != c


def test_acceptance_rule_samples_the_target_distribution():
    """Point-mass draft d: accept w.p. p(d), else sample p without d. The first emitted token
    must be distributed as p (checked per token within 5 binomial standard deviations)."""
    torch.manual_seed(0)
    logits = torch.randn(2, 6)
    p = torch.softmax(logits[0], -1)
    gen = torch.Generator().manual_seed(1)
    sp = SamplingParams(temperature=1.0)
    n = 4000
    counts = torch.zeros(6)
    for _ in range(n):
        counts[accept_drafts(logits, [int(p.argmax())], sp, gen)[0]] += 1
    sd = (n * p * (1 - p)).sqrt()
    assert ((counts - n * p).abs() <= 5 * sd + 1).all(), (counts / n, p)
    assert math.isclose(float(counts.sum()), n)


def test_engine_failure_ends_pending_requests():
    """A failing forward must not leave clients waiting forever: the requests of the failed
    batches end with "error"; the engine itself keeps serving (tests/mini/test_mini_faults.py)."""
    eng = engine(max_running_requests=1)

    def boom(*a, **k):
        raise RuntimeError("injected")

    eng.model.forward_flat = boom
    events = []
    eng.start()
    try:
        eng.submit(tk.encode("a"), SamplingParams(max_tokens=4), events.append)
        eng.submit(tk.encode("b"), SamplingParams(max_tokens=4), events.append)  # queued
        deadline = time.time() + 10
        while len(events) < 2 and time.time() < deadline:
            time.sleep(0.01)
    finally:
        eng.stop()
    assert [e.finish_reason for e in events] == ["error", "error"]
    assert all("injected" in e.error for e in events)
    assert eng.error is None  # the scheduler loop lives on


KERNEL_CHECK = """
import sys
from servelab.mini.model import tokenizer as tk
from servelab.mini.engine.args import EngineArgs
from servelab.mini.engine.engine import Engine
from servelab.mini.engine.sampling import SamplingParams
out = []
for backend in ("torch", sys.argv[1]):
    e = Engine(EngineArgs(config="micro", random_weights=True, attention_backend=backend,
                          context_length=64, max_running_requests=2))
    sp = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    out.append([e.generate(tk.encode(p), sp)[0] for p in ("hello world", "import os")])
print(out[0] == out[1], out)
"""


@pytest.mark.parametrize("backend", ["naive", "splitkv"])
def test_kernel_attention_backends_match_torch(backend):
    """--attention-backend naive|splitkv (the sparse MLA Triton kernels, interpreted on the CPU)
    gives the same greedy tokens as our torch gather + softmax. A subprocess, because Triton
    decides at import time whether kernels are interpreted."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", KERNEL_CHECK, backend], env=env,
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("True"), res.stdout


def test_kernel_backend_on_cpu_needs_interpreter(monkeypatch):
    from servelab.errors import UserError

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(UserError, match="--device cuda"):
        engine(attention_backend="splitkv")


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


@pytest.mark.parametrize("spec", [None, "EAGLE"])
def test_min_tokens_and_ignore_eos_against_an_eos_loving_model(spec):
    """With EOS made the argmax everywhere: no min_tokens stops at once, min_tokens N emits N
    other tokens and then EOS, ignore_eos runs to max_tokens (plain decode and MTP verify)."""
    eng = engine(max_running_requests=2, speculative_algorithm=spec)
    real = eng.model.forward_flat

    def eos_first(*a, **k):
        logits, hidden = real(*a, **k)
        logits[:, tk.EOS] += 1e4
        return logits, hidden

    eng.model.forward_flat = eos_first
    p = tk.encode("x = 1")
    ids, _, ev = eng.generate(p, SamplingParams(max_tokens=20, temperature=0.0))
    assert ids == [tk.EOS] and ev.finish_reason == "stop"
    ids, _, ev = eng.generate(p, SamplingParams(max_tokens=20, temperature=0.0, min_tokens=5))
    assert len(ids) == 6 and ids[-1] == tk.EOS and tk.EOS not in ids[:-1]
    assert ev.finish_reason == "stop"
    ids, _, ev = eng.generate(p, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    assert len(ids) == 20 and ev.finish_reason == "length"


def test_top_p_keeps_the_smallest_nucleus():
    from servelab.mini.engine.sampling import target_probs

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = torch.softmax(logits[0], -1)  # 0.644, 0.237, 0.087, 0.032
    got = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))[0]
    want = torch.tensor([p[0], p[1], 0, 0]) / (p[0] + p[1])
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(target_probs(logits, SamplingParams(temperature=1.0))[0], p)
