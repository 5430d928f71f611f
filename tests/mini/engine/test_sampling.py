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
