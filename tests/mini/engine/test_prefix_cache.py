"""The prefix cache (engine/prefix_cache.py) in the engine: a shared prefix is reused (reported
as cached tokens, and the forward computes only the rest), greedy output and MTP drafting are
the same with the cache on and off, eviction under a pool of two blocks keeps outputs right,
whole blocks only with the last prompt token always computed, least recently used leaves
evicted first, and a prefill server's handoff carries the whole prompt's rows."""

from __future__ import annotations

import pytest
import torch
from mini_engines import GREEDY, engine, run_all
from mini_pd import prefill
from mini_pd import run as run_pd

from servelab.mini.engine.prefix_cache import PrefixCache
from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.model import tokenizer as tk
from servelab.mini.model.config import get_config
from servelab.mini.model.model import KVCache
from servelab.mini.server.pd.wire import decode

SYSTEM = "# a shared system prompt\nimport os\nimport sys\n\nLIMIT = 10\n"
QUESTIONS = ["def f(x):\n    return", "class A:\n    pass\n", "x = [1, 2, 3]", "while True:"]


def _expected_cached(prompt: list[int], seen: list[list[int]], page: int = 16) -> int:
    """Whole blocks of the longest common prefix with a prompt seen before, last token left
    out."""
    best = 0
    for s in seen:
        n = next((i for i, (a, b) in enumerate(zip(prompt, s, strict=False)) if a != b),
                 min(len(prompt), len(s)))
        best = max(best, n)
    return min(best, len(prompt) - 1) // page * page


@pytest.mark.parametrize("steps", [0, 1])
def test_a_shared_prefix_is_reused_and_the_forward_computes_the_rest_only(steps):
    """Requests that end at their first token (max_tokens 1) free their slot before their
    blocks are cached: the rows are read from the slot they had (an insert from slot -1 once
    failed the step silently and left blocks without their rows)."""
    spec = {"speculative_algorithm": "EAGLE", "speculative_num_steps": steps} if steps else {}
    eng = engine("tiny", **spec)
    one = SamplingParams(max_tokens=1, **GREEDY)  # prefill only: no decode step follows
    p1, p2 = tk.encode(SYSTEM + QUESTIONS[0]), tk.encode(SYSTEM + QUESTIONS[1])
    _, _, ev1 = eng.generate(p1, one)
    assert ev1.cached_tokens == 0
    before = eng.stats.forward_tokens
    _, _, ev2 = eng.generate(p2, one)
    want = _expected_cached(p2, [p1])
    assert want >= 48, "the test's prompts must share whole blocks"
    assert ev2.cached_tokens == want
    assert eng.stats.forward_tokens - before == len(p2) - want
    assert eng.stats.prefix_cache_queries == len(p1) + len(p2)
    assert eng.stats.prefix_cache_hits == want
    longer = SamplingParams(max_tokens=30, **GREEDY)
    p3 = tk.encode(SYSTEM + QUESTIONS[2])
    off = engine("tiny", disable_radix_cache=True, **spec)
    assert eng.generate(p3, longer)[0] == off.generate(p3, longer)[0]
    assert eng.last_failure is None and eng.stats.finished["error"] == 0


@pytest.mark.parametrize("steps", [0, 1])
def test_a_burst_sharing_a_new_prefix_computes_it_once(steps):
    """Submitted together, the first prompt is prefilled alone and the others, one step later,
    reuse its blocks (prompts of one step cannot reuse each other's); the queue stays first in,
    first out (the unrelated prompt behind them waits with them)."""
    spec = {"speculative_algorithm": "EAGLE", "speculative_num_steps": steps} if steps else {}
    prompts = [tk.encode(SYSTEM + q) for q in QUESTIONS] + [tk.encode("print(1)\n" * 6)]
    params = [SamplingParams(max_tokens=12, **GREEDY)] * len(prompts)
    off = engine("tiny", disable_radix_cache=True, max_running_requests=8, **spec)
    on = engine("tiny", max_running_requests=8, **spec)
    events: dict[int, list] = {i: [] for i in range(len(prompts))}
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        on.submit(p, sp, events[i].append)
    on.step()
    assert on.num_running == 1 and on.num_waiting == 4  # the others wait for its blocks
    while any(not e or e[-1].finish_reason is None for e in events.values()):
        on.step()
    got = [[t for ev in events[i] for t in ev.token_ids] for i in range(len(prompts))]
    assert got == run_all(off, prompts, params)
    assert [events[i][-1].cached_tokens for i in range(len(prompts))] == [0, 48, 48, 48, 0]


def test_the_same_prompt_again_reuses_all_but_its_last_token():
    eng = engine("micro")
    one = SamplingParams(max_tokens=1, **GREEDY)
    for n in (32, 33, 47):  # a whole number of blocks, one past, one short of the next
        p = [tk.BOS] + [65 + (n + i) % 26 for i in range(n - 1)]
        assert eng.generate(p, one)[2].cached_tokens == 0
        assert eng.generate(p, one)[2].cached_tokens == (n - 1) // 16 * 16


@pytest.mark.parametrize(("config", "steps"), [("micro", 0), ("tiny", 0), ("tiny", 1),
                                               ("tiny", 3)])
def test_greedy_output_and_drafts_are_the_same_with_the_cache_on_and_off(config, steps):
    spec = {"speculative_algorithm": "EAGLE", "speculative_num_steps": steps} if steps else {}
    prompts = [tk.encode(SYSTEM + q) for q in QUESTIONS]
    prompts += [tk.encode(SYSTEM * 2 + QUESTIONS[0]), prompts[0]]
    params = [SamplingParams(max_tokens=24 + 3 * i, **GREEDY) for i in range(len(prompts))]
    off = engine(config, disable_radix_cache=True, **spec)
    on = engine(config, **spec)
    assert off.prefix is None and on.prefix is not None
    # one at a time (each request reuses the ones before), then all at once (batched)
    want = [run_all(off, [p], [sp])[0] for p, sp in zip(prompts, params, strict=True)]
    got = [run_all(on, [p], [sp])[0] for p, sp in zip(prompts, params, strict=True)]
    assert got == want
    assert on.stats.prefix_cache_hits >= 48 * (len(prompts) - 1)
    # the MTP layer's reused rows draft exactly as computed ones: same acceptance per position
    assert on.stats.spec_accepted_per_pos == off.stats.spec_accepted_per_pos
    # the same decode and verify steps: the main forward skipped exactly the reused tokens
    assert off.stats.forward_tokens - on.stats.forward_tokens == on.stats.prefix_cache_hits
    assert run_all(on, prompts, params) == want


@pytest.mark.parametrize("steps", [0, 1])
def test_eviction_under_a_pool_of_two_blocks_keeps_outputs_right(steps):
    spec = {"speculative_algorithm": "EAGLE", "speculative_num_steps": steps} if steps else {}
    systems = [f"# system {i}\n" + "import os\n" * 3 for i in range(3)]
    # two questions per system (the second reuses the first's blocks), then the first again
    # (its blocks were evicted: the pool holds two blocks, less than one system prompt + one
    # question)
    prompts = [tk.encode(s + q) for s in systems for q in QUESTIONS[:2]]
    prompts.append(prompts[0])
    params = [SamplingParams(max_tokens=16, **GREEDY)] * len(prompts)
    off = engine("tiny", disable_radix_cache=True, **spec)
    small = engine("tiny", prefix_cache_tokens=32, **spec)
    want = [run_all(off, [p], [sp])[0] for p, sp in zip(prompts, params, strict=True)]
    got = [run_all(small, [p], [sp])[0] for p, sp in zip(prompts, params, strict=True)]
    assert got == want
    assert small.stats.spec_accepted_per_pos == off.stats.spec_accepted_per_pos
    assert small.prefix is not None and small.prefix.evictions > 0
    assert small.prefix.cached_blocks <= 2
    assert small.stats.prefix_cache_hits == 3 * 32  # each second question: two blocks
    assert run_all(small, prompts, params) == want  # batched: loads come before evictions


def test_least_recently_used_leaves_go_first_and_keys_are_exact():
    cfg = get_config("micro")
    cache = KVCache(cfg, 1, 80, "cpu", torch.float32)
    pc = PrefixCache(cfg, cfg.n_layers, page_size=4, num_blocks=3, device="cpu",
                     dtype=torch.float32, mtp=False)
    a = list(range(1, 14))  # 3 whole blocks + 1 token
    assert pc.insert(cache, 0, a, None) == 3
    assert pc.match(a).tokens == 12
    b = [99] + a[1:5]  # one block, differing in its first token: shares nothing
    assert pc.match(b).tokens == 0
    assert pc.insert(cache, 0, b, None) == 1  # pool full: evicts a's leaf, not its root
    assert pc.evictions == 1
    assert pc.match(a).tokens == 8 and pc.match(b).tokens == 4
    c = a[:4] + [77] * 5  # a's root, then its own block: a's second block is the oldest leaf
    assert pc.insert(cache, 0, c, None) == 1
    assert pc.match(a).tokens == 4 and pc.match(c).tokens == 8 and pc.match(b).tokens == 4
    assert pc.insert(cache, 0, [1, 2, 3], None) == 0  # no whole block
    # rows go in and come back where they belong
    cache.kv[0][0:12] = torch.arange(12.0)[:, None]
    pc2 = PrefixCache(cfg, 1, page_size=4, num_blocks=3, device="cpu", dtype=torch.float32,
                      mtp=False)
    pc2.insert(cache, 0, a, None)
    cache.kv[0].zero_()
    pc2.load(cache, [(0, pc2.match(a))])
    assert torch.equal(cache.kv[0][0:12, 0], torch.arange(12.0))
    assert not cache.kv[0][12:].any()


@pytest.mark.parametrize("steps", [0, 1])
def test_a_prefill_server_with_the_cache_hands_off_the_whole_prompt(steps):
    spec = {"speculative_algorithm": "EAGLE", "speculative_num_steps": steps} if steps else {}
    one = engine("tiny", disable_radix_cache=True, **spec)
    pre = engine("tiny", **spec)
    dec = engine("tiny", disaggregation_mode="decode", **spec)
    assert dec.prefix is None  # a decode server never prefills: nothing to reuse
    sp = SamplingParams(max_tokens=30, **GREEDY)
    for i, q in enumerate(QUESTIONS[:3]):
        prompt = tk.encode(SYSTEM + q)
        wire, _ = prefill(pre, prompt, sp, room=i)
        h = decode(wire)
        assert h.kv.shape[1] == len(prompt)
        assert h.cached_tokens == (0 if i == 0 else _expected_cached(
            prompt, [tk.encode(SYSTEM + QUESTIONS[0])]))
        dec.check_handoff(h, prompt)
        events = []
        dec.submit(prompt, sp, events.append, room=h.room, handoff=h)
        while not events or events[-1].finish_reason is None:
            dec.step()
        assert [t for e in events for t in e.token_ids] == run_pd(one, prompt, sp)
        assert events[-1].cached_tokens == h.cached_tokens  # the prefill's reuse, reported
    assert pre.stats.prefix_cache_hits > 0 and dec.stats.prompt_tokens == 0


@pytest.mark.parametrize("page", [1, 7])
def test_any_page_size_reuses_whole_pages_with_the_same_output(page):
    spec = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 2}
    prompts = [tk.encode(SYSTEM + q) for q in QUESTIONS[:3]]
    params = [SamplingParams(max_tokens=16, **GREEDY)] * len(prompts)
    off = engine("tiny", disable_radix_cache=True, **spec)
    on = engine("tiny", page_size=page, **spec)
    want = [run_all(off, [p], [sp])[0] for p, sp in zip(prompts, params, strict=True)]
    got = [run_all(on, [p], [sp])[0] for p, sp in zip(prompts, params, strict=True)]
    assert got == want
    assert on.stats.spec_accepted_per_pos == off.stats.spec_accepted_per_pos
    common = len(tk.encode(SYSTEM))  # the questions differ from their first byte
    assert on.stats.prefix_cache_hits == 2 * (common // page * page)


def test_a_pool_smaller_than_a_page_is_refused():
    from servelab.errors import UserError

    with pytest.raises(UserError, match="holds no block of --page-size 16"):
        engine("micro", prefix_cache_tokens=8)
    with pytest.raises(UserError, match="--page-size 0: must be >= 1"):
        engine("micro", page_size=0)


def test_two_prompts_that_part_at_a_block_boundary_keep_their_own_mtp_rows():
    """X and Y share three whole blocks and differ from the fourth; Z continues Y. The MTP row
    of position 47 reads token 48, X's or Y's: Z must get Y's (it is kept with Y's fourth
    block, not with the shared third). Every row Z's prefill server hands off, reused or
    computed, equals a server's without the cache, up to the summation order of the batched
    GEMMs (|row| ~ 1, fp32: 1e-4 is 800 units of 1.2e-7; a row from the other prompt is off by
    O(0.1..1))."""
    spec = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1}
    base = tk.encode(SYSTEM * 2)[:48]
    x, y = base + tk.encode("xx = 1\n" * 3)[1:], base + tk.encode("yy = 2\n" * 3)[1:]
    z = y + tk.encode("# and so on\n")[1:]
    assert x[48] != y[48] and len(y) > 64
    sp = SamplingParams(max_tokens=2, **GREEDY)
    pre = engine("tiny", **spec)
    cold = engine("tiny", disable_radix_cache=True, **spec)
    for i, p in enumerate((x, y)):
        prefill(pre, p, sp, room=i)
    hz = decode(prefill(pre, z, sp, room=2)[0])
    assert hz.cached_tokens == 64
    want = decode(prefill(cold, z, sp, room=3)[0])
    for got, ref, what in ((hz.kv, want.kv, "kv"), (hz.ik, want.ik, "ik")):
        err = (got - ref).abs().amax(-1)  # [L, S]
        bad = (err > 1e-4).nonzero().tolist()
        assert not bad, f"{what}: {len(bad)} rows differ, first (layer, position) {bad[:4]}, " \
                        f"max abs error {err.max().item():.3g}"


@pytest.mark.parametrize("steps", [0, 1, 3])
def test_a_conversations_next_turn_reuses_the_previous_answer(steps):
    """Turn 2 resends turn 1's prompt and the model's answer: both were cached when turn 1
    finished (with MTP only what its MTP rows cover: a request that ends in a verify step
    skips that step's MTP pass). Greedy answers and accepted drafts equal the cache-off ones."""
    spec = {"speculative_algorithm": "EAGLE", "speculative_num_steps": steps} if steps else {}
    off = engine("tiny", disable_radix_cache=True, **spec)
    on = engine("tiny", **spec)
    sp = SamplingParams(max_tokens=40, **GREEDY)
    history, seen = tk.encode(SYSTEM + QUESTIONS[0]), 0
    for turn in range(3):
        want = off.generate(history, sp)[0]
        got, _, last = on.generate(history, sp)
        assert got == want, f"turn {turn}"
        # the previous turn's prompt and answer, in whole blocks, but for its last token (never
        # fed) and, with MTP, up to k more (the MTP rows of the final verify step)
        assert (seen - 1 - steps) // 16 * 16 <= last.cached_tokens <= seen // 16 * 16
        seen = len(history) + len(got)
        history = history + got + tk.encode(f"\n# turn {turn + 2}\n")[1:]
    assert on.stats.spec_accepted_per_pos == off.stats.spec_accepted_per_pos
    assert on.last_failure is None
