"""Sampling: parameters, logit processing (EOS masking for min_tokens / ignore_eos, temperature,
top-p), and the acceptance rule of speculative decoding.

Drafts come from the MTP head's argmax (a point-mass proposal q = delta(d)), so the exact
speculative-sampling rule (Leviathan et al. 2023) reduces to: accept d with probability p(d);
on rejection sample from p with d removed (renormalized). Greedy requests accept d iff it is
the target's argmax; the output is then identical to greedy decoding without speculation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from servelab.mini.model.tokenizer import BOS, EOS

# Below this temperature a request is greedy, as vLLM rules (its _SAMPLING_EPS; SGLang's is
# 1e-6): logits / 1e-40 overflow float32 to inf and softmax turns them into NaN, so no float32
# sampler can compute such a temperature, and its limit is the argmax anyway.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What one request asks for; validated by the server before it reaches the engine."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def mask_logits(logits: torch.Tensor, allow_eos: torch.Tensor) -> torch.Tensor:
    """logits [N, V]; allow_eos [N] bool. Special tokens other than EOS are never produced."""
    out = logits.clone()
    out[:, BOS:] = float("-inf")  # the specials follow the 256 byte tokens, BOS first
    out[:, EOS] = torch.where(allow_eos, logits[:, EOS], torch.full_like(logits[:, EOS],
                                                                          float("-inf")))
    return out


def target_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Masked logits [n, V] -> the distribution to sample from (temperature, then top-p).

    Safe in float32 for every temperature >= GREEDY_BELOW and every top_p in (0, 1]: the
    largest logit is subtracted first (the top token's weight is exp(0) = 1, so the sum is never
    0 or inf), and the top token is always kept (a top_p of 1e-300 is 0 in float32)."""
    top = logits.max(dim=-1, keepdim=True).values
    probs = torch.softmax((logits - top) / p.temperature, dim=-1)  # [n, V]
    if p.top_p < 1.0:
        sp, si = probs.sort(dim=-1, descending=True)
        keep = (sp.cumsum(-1) - sp) < p.top_p
        keep[..., 0] = True
        sp = sp * keep
        probs = torch.zeros_like(probs).scatter_(-1, si, sp)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_row(probs: torch.Tensor, gen: torch.Generator | None) -> int:
    """One token from probs [V]."""
    return int(torch.multinomial(probs, 1, generator=gen).item())


def accept_drafts(logits: torch.Tensor, drafts: list[int], p: SamplingParams,
                  gen: torch.Generator | None) -> list[int]:
    """Verify: logits [k+1, V] (masked) at the positions of [last, d_1..d_k].

    Returns the tokens produced this step: the accepted drafts plus one more (the correction or
    the bonus token), 1..k+1 tokens.
    """
    if p.greedy:
        target = logits.argmax(-1).tolist()
        out = []
        for i, d in enumerate(drafts):
            out.append(target[i])
            if d != target[i]:
                return out
        out.append(target[len(drafts)])
        return out
    probs = target_probs(logits, p)
    out = []
    for i, d in enumerate(drafts):
        pd = float(probs[i, d])
        u = float(torch.rand((), generator=gen))
        if u < pd:
            out.append(d)
            continue
        residual = probs[i].clone()
        residual[d] = 0.0
        s = float(residual.sum())
        out.append(sample_row(residual / s, gen) if s > 0 else d)
        return out
    out.append(sample_row(probs[len(drafts)], gen))
    return out
