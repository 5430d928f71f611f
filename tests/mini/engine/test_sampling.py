"""Sampling (engine/sampling.py): the speculative acceptance rule samples the target
distribution, and top-p keeps the smallest nucleus."""

from __future__ import annotations

import math

import torch

from servelab.mini.engine.sampling import SamplingParams, accept_drafts, target_probs


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


def test_top_p_keeps_the_smallest_nucleus():

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = torch.softmax(logits[0], -1)  # 0.644, 0.237, 0.087, 0.032
    got = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))[0]
    want = torch.tensor([p[0], p[1], 0, 0]) / (p[0] + p[1])
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(target_probs(logits, SamplingParams(temperature=1.0))[0], p)


def test_every_temperature_and_top_p_the_api_allows_gives_a_distribution():
    """`temperature 1e-40` overflowed logits / T to inf (softmax: NaN) and `top_p 1e-300` is 0
    in float32 (no token kept: 0 / 0); both ended in a 500 from torch.multinomial. A temperature
    below GREEDY_BELOW is greedy (vLLM's rule); the rest compute in float32."""
    from servelab.mini.engine.sampling import GREEDY_BELOW, mask_logits, sample_row

    torch.manual_seed(0)
    logits = mask_logits(torch.randn(3, 300) * 30, torch.tensor([True, False, True]))
    gen = torch.Generator().manual_seed(0)
    for t in (1e-40, 1e-30, 9.9e-6, GREEDY_BELOW, 1e-3, 0.7, 100.0):
        for top_p in (1e-300, 1e-45, 1e-8, 0.5, 1.0):
            sp = SamplingParams(temperature=t, top_p=top_p)
            if sp.greedy:
                assert t < GREEDY_BELOW
                continue
            probs = target_probs(logits, sp)
            assert torch.isfinite(probs).all() and (probs >= 0).all(), (t, top_p)
            assert torch.allclose(probs.sum(-1), torch.ones(3)), (t, top_p)
            toks = [sample_row(probs[i], gen) for i in range(3)]
            if top_p <= 1e-8 or t <= 1e-3:  # only the top token survives
                assert toks == logits.argmax(-1).tolist(), (t, top_p)
    assert SamplingParams(temperature=1e-40).greedy
    assert accept_drafts(logits[:2], [5], SamplingParams(temperature=1e-6, top_p=1e-300),
                         None) == [int(logits[0].argmax()), int(logits[1].argmax())][
        :1 if int(logits[0].argmax()) != 5 else 2]
