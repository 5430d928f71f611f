"""Engine behaviour (engine/engine.py): speculative decoding reproduces greedy decoding exactly,
batching and queueing do not change any request's output, seeded sampling is reproducible,
min_tokens and ignore_eos hold against a model that wants to stop, and a failing forward ends
its requests instead of leaving them waiting. Stop strings and max_tokens: test_request.py; the
acceptance rule and top-p: test_sampling.py; CUDA graphs: test_graphs.py."""

from __future__ import annotations

import time

import pytest
from mini_engines import GREEDY, PROMPTS, engine, run_all

from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.model import tokenizer as tk


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


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


def test_seeded_sampling_is_reproducible():
    eng = engine("tiny")
    p = tk.encode("def main(")
    sp = SamplingParams(max_tokens=30, temperature=0.9, top_p=0.9, seed=7)
    a = eng.generate(p, sp)[0]
    b = eng.generate(p, sp)[0]
    c = eng.generate(p, SamplingParams(max_tokens=30, temperature=0.9, top_p=0.9, seed=8))[0]
    assert a == b and a != c


def test_engine_failure_ends_pending_requests():
    """A failing forward must not leave clients waiting forever: the requests of the failed
    batches end with "error"; the engine itself keeps serving (test_engine_faults.py)."""
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




def test_kv_cache_usage_is_the_share_of_token_rows_running_requests_hold():
    """After each step, the gauge equals the rows the running requests have written (their
    prompt, then one more per decode step) over the cache's rows per slot x slots, read off
    the KV tensors themselves; 0 once every request has finished."""
    eng = engine(max_running_requests=4)
    rows_per_slot = eng.cache.kv[0].shape[0] // (eng.args.max_running_requests + 1)  # + scratch
    assert eng.kv_cache_usage == 0.0
    done: list[int] = []
    lens, new = (11, 23), 6
    for n in lens:
        eng.submit(list(range(1, n + 1)), SamplingParams(max_tokens=new, **GREEDY),
                   lambda ev: ev.finish_reason and done.append(1))
    seen = []
    while len(done) < len(lens):
        eng.step()
        if len(done) < len(lens):
            seen.append(eng.kv_cache_usage * eng.args.max_running_requests * rows_per_slot)
    # step i prefills (step 1: each holds its prompt) and decodes: the token sampled last
    # step goes into the KV, one row per request; the 6th token ends both at step 5
    assert seen == [pytest.approx(sum(lens) + 2 * i) for i in range(1, new - 1)], seen
    assert eng.kv_cache_usage == 0.0
