"""Training (mini/train.py, `python -m servelab.mini.train`): reproducible from its seed."""

from __future__ import annotations

import argparse

import torch

from servelab.mini.model.config import get_config
from servelab.mini.train import train


def test_training_is_reproducible_from_the_seed(tmp_path):
    """`python -m servelab.mini.train --steps N --seed S` is reproducible on the CPU: the same
    seed gives bit-identical weights and losses, another seed different ones (micro config and
    a seeded synthetic corpus, so it runs in a second)."""
    g = torch.Generator().manual_seed(0)
    corpus = torch.randint(32, 127, (4000,), generator=g, dtype=torch.uint8)
    held = [bytes(torch.randint(32, 127, (300,), generator=g).tolist())]
    cfg = get_config("micro")

    def run(seed: int, name: str) -> dict:
        a = argparse.Namespace(steps=3, batch=2, seq=32, lr=3e-3, seed=seed, device="cpu",
                               log_every=1, out=tmp_path / name)
        train(a, cfg, corpus, held, {"source": "synthetic"})
        return torch.load(a.out, weights_only=True)

    a, b, c = run(0, "a.pt"), run(0, "b.pt"), run(1, "c.pt")
    assert a["meta"]["loss_log"] == b["meta"]["loss_log"]
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    assert a["meta"]["loss_log"] != c["meta"]["loss_log"]
    assert a["meta"]["train"]["command"].endswith("--steps 3 --batch 2 --seq 32 --seed 0")
