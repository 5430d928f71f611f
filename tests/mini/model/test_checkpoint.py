"""Checkpoints (model/checkpoint.py): the shipped `tiny` checkpoint is found in mini/weights/,
loads on the CPU, is small, and carries the training run's held-out loss and MTP acceptance."""

from __future__ import annotations

import pytest

from servelab.mini.model.checkpoint import load_model, shipped_weights


def test_checkpoint_loads_on_cpu_and_is_small():
    path = shipped_weights("tiny")
    if path is None:
        pytest.skip("no shipped checkpoint")
    assert path.stat().st_size <= 10 * 2**20
    model, meta = load_model("tiny", None, "cpu")
    assert meta["weights"] == str(path)
    assert meta["heldout_losses"]["main"] < 1.5  # nats/byte; uniform would be ln(264) = 5.6
    assert meta["mtp_acceptance"]["steps1"]["accept_rate_per_pos"][0] >= 0.6
