"""The order of runs (experiment/plan/schedule.py): interleaved ABBA blocks with the baseline
first, seeded shuffled blocks, sequential runs unpaired, and the deployments each restart mode
groups."""

from __future__ import annotations

from servelab.experiment.design.parse import parse
from servelab.experiment.plan.schedule import plan


def _spec(order, reps=3, restart="run", seed=0):
    return parse(
        {
            "name": "s",
            "engine": "sglang",
            "model": "m",
            "baseline": "B",
            "arms": {"A": {}, "B": {}},
            "load": {"concurrency": [1, 16]},
            "repetitions": reps,
            "order": order,
            "restart": restart,
            "seed": seed,
        }
    )


def test_schedule_interleaved_abba_baseline_first():
    runs = plan(_spec("interleaved", reps=4))
    arms = [r.arm for r in runs if r.load_key == "c=1"]
    assert arms == ["B", "A", "A", "B", "B", "A", "A", "B"]
    assert [r.block for r in runs if r.load_key == "c=1"] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert len({r.group for r in runs}) == len(runs)  # fresh deployment per run
    per_arm = plan(_spec("interleaved", restart="arm"))
    assert len({r.group for r in per_arm}) == 6 and len(per_arm) == 12


def test_schedule_shuffled_is_seeded_and_sequential_unpaired():
    a, b = plan(_spec("shuffled", reps=8, seed=1)), plan(_spec("shuffled", reps=8, seed=1))
    assert [r.arm for r in a] == [r.arm for r in b]
    orders = {tuple(r.arm for r in a if r.block == k and r.load_key == "c=1") for k in range(8)}
    assert orders == {("A", "B"), ("B", "A")}  # both orders occur, pairs kept
    seq = plan(_spec("sequential"))
    assert [r.arm for r in seq] == ["B"] * 6 + ["A"] * 6 and all(r.block is None for r in seq)
    assert sorted({(r.arm, r.load_key, r.repetition) for r in seq}) == sorted(
        (arm, lk, rep) for arm in "AB" for lk in ("c=1", "c=16") for rep in range(3)
    )
