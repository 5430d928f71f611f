"""Failure isolation in the engine: a request whose own work fails ends with "error" and the
others produce exactly what they produce alone; a failed batch ends only its requests; the
engine keeps serving and /metrics-style counters tell finished from failed and aborted."""

from __future__ import annotations

import time

import torch

from servelab.mini.engine import phases as phases_mod  # where the engine samples
from servelab.mini.engine.args import EngineArgs
from servelab.mini.engine.engine import UNHEALTHY_AFTER, Engine
from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.model import tokenizer as tk

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def _engine(**kw) -> Engine:
    return Engine(EngineArgs(config="micro", random_weights=True, context_length=128, **kw))


def _run(eng: Engine, reqs: list[tuple[list[int], SamplingParams]]) -> list[list]:
    """Submit together, step until all finished; the events of each request."""
    evs: list[list] = [[] for _ in reqs]
    for i, (p, sp) in enumerate(reqs):
        eng.submit(p, sp, evs[i].append)
    for _ in range(1000):
        if all(e and e[-1].finish_reason for e in evs):
            break
        eng.step()
    return evs


def _ids(evs: list) -> list[int]:
    return [t for e in evs for t in e.token_ids]


def test_a_failing_sampler_fails_that_request_alone(monkeypatch):
    """Sampling that raises for one request (as NaN probabilities did) ends it with "error";
    its batch neighbour's tokens equal those it gets alone; the engine serves the next one."""
    eng = _engine(max_running_requests=2)
    alone = _ids(_run(eng, [(tk.encode("hello"), GREEDY)])[0])
    real = phases_mod.sample_row

    def sample_row(probs, gen):
        if gen is not None and gen.initial_seed() == 13:
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return real(probs, gen)

    monkeypatch.setattr(phases_mod, "sample_row", sample_row)
    bad = SamplingParams(max_tokens=8, temperature=1.0, seed=13)
    good, failed = _run(eng, [(tk.encode("hello"), GREEDY), (tk.encode("x"), bad)])
    assert failed[-1].finish_reason == "error" and "nan" in failed[-1].error
    assert _ids(good) == alone and good[-1].finish_reason == "length"
    assert eng.unhealthy() is None and eng.error is None
    assert eng.num_running == 0 and len(eng._free) == 2  # both slots back
    again = _run(eng, [(tk.encode("hello"), GREEDY)])[0]
    assert _ids(again) == alone
    assert eng.stats.finished["error"] == 1 and eng.stats.finished["length"] == 3


def test_a_failing_forward_fails_its_batch_and_health_follows_repeats():
    """A forward that raises ends the requests of that step; after UNHEALTHY_AFTER failed
    steps in a row /health would say so; one good step makes the engine healthy again."""
    eng = _engine(max_running_requests=1)
    real = eng.model.forward_flat
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        raise RuntimeError("CUDA error: an illegal memory access (injected)")

    eng.model.forward_flat = flaky
    evs = _run(eng, [(tk.encode(c), GREEDY) for c in "abc"])
    assert [e[-1].finish_reason for e in evs] == ["error"] * 3
    assert eng.failed_steps == 3 >= UNHEALTHY_AFTER and "illegal" in eng.unhealthy()
    eng.model.forward_flat = real
    ok = _run(eng, [(tk.encode("a"), GREEDY)])[0]
    assert ok[-1].finish_reason == "length" and len(_ids(ok)) == 8
    assert eng.unhealthy() is None


def test_a_failing_listener_does_not_stop_the_engine():
    """A callback that raises (a client's event loop gone) ends that request, not the loop."""
    eng = _engine(max_running_requests=2)
    got: list = []

    def broken(_ev):
        raise RuntimeError("event loop is closed")

    eng.start()
    try:
        eng.submit(tk.encode("a"), GREEDY, broken)
        eng.submit(tk.encode("b"), GREEDY, got.append)
        deadline = time.time() + 20
        while not (got and got[-1].finish_reason) and time.time() < deadline:
            time.sleep(0.01)
    finally:
        eng.stop()
    assert got[-1].finish_reason == "length" and eng.error is None
    assert eng.stats.finished["error"] == 1


def test_an_unusable_seed_is_refused_at_submit():
    """2**70 does not fit torch's generator: refused before it reaches the engine thread."""
    eng = _engine()
    try:
        eng.submit(tk.encode("a"), SamplingParams(seed=2**70), lambda ev: None)
    except Exception as exc:  # noqa: BLE001
        assert type(exc).__name__ == "UserError" and "seed" in str(exc)
    else:
        raise AssertionError("seed 2**70 accepted")
    assert torch.Generator().manual_seed(2**64 - 1) is not None  # the top of the allowed range
