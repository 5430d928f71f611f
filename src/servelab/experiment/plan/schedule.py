"""The order of runs: interleaved ABBA blocks (default), shuffled blocks (seeded), or sequential.

One run = one arm x one load point x one repetition. Repetition r of every arm forms block r;
within a block the arms run back to back, so slow drift of the machine hits all arms alike and
the effect can be paired by block. Interleaved alternates the arm order (AB, BA, AB, ...);
shuffled draws each block's arm order from a seeded generator; sequential runs all repetitions
of one arm before the next (no pairing: only for engines that cannot be restarted cheaply).

Deployments: restart 'run' launches one per run; 'arm' one per arm per block (all its load
points); 'block' keeps every arm of a block up at once and runs the arms back to back at each
load point, so paired runs are seconds apart (for machines that hold all arms: CPU, small models).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from servelab.experiment.design.model import ExperimentSpec


@dataclass(frozen=True, slots=True)
class PlannedRun:
    """One run in schedule order; runs with the same `group` share one deployment."""

    seq: int
    arm: str
    load_key: str
    concurrency: int | None
    request_rate: float | None
    repetition: int
    block: int | None
    group: int

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.arm, self.load_key, self.repetition)

    def describe(self) -> str:
        return f"arm {self.arm}, {self.load_key}, rep {self.repetition + 1}"


def arm_orders(arms: list[str], repetitions: int, order: str, seed: int) -> list[list[str]]:
    """The arm order of each block (for 'sequential': one block per arm and repetition)."""
    if order == "interleaved":
        return [list(arms) if b % 2 == 0 else list(reversed(arms)) for b in range(repetitions)]
    if order == "shuffled":
        rng = random.Random(seed)
        out = []
        for _ in range(repetitions):
            block = list(arms)
            rng.shuffle(block)
            out.append(block)
        return out
    if order == "sequential":
        return [[a] for a in arms for _ in range(repetitions)]
    raise ValueError(f"unknown order {order!r}")


def plan(spec: ExperimentSpec) -> list[PlannedRun]:
    """Every run the experiment may make, in order: `spec.blocks` blocks (with adaptive
    repetitions or repeated blocks the runner stops before the end of this list)."""
    # the baseline leads the first block, so 'interleaved' reads baseline, change, change, baseline
    arms = spec.arm_order
    loads = spec.load.keys()
    runs: list[PlannedRun] = []
    group = -1
    reps_seen: dict[str, int] = {}
    orders = arm_orders(arms, spec.blocks, spec.order, spec.seed)

    def add(
        arm: str,
        load: tuple[str, int | None, float | None],
        rep: int,
        block: int | None,
        group: int,
    ) -> None:
        key, c, r = load
        runs.append(
            PlannedRun(
                seq=len(runs),
                arm=arm,
                load_key=key,
                concurrency=c,
                request_rate=r,
                repetition=rep,
                block=block,
                group=group,
            )
        )

    if spec.restart == "block" and spec.order != "sequential":
        # all arms of a block deployed together: per load point the arms run back to back (pairs
        # seconds apart), the arm order alternating between load points (ABBA within the block)
        for b, block in enumerate(orders):
            for j, load in enumerate(loads):
                for arm in block if j % 2 == 0 else list(reversed(block)):
                    add(arm, load, rep=b, block=b, group=b)
        return runs
    for b, block in enumerate(orders):
        for arm in block:
            rep = reps_seen.get(arm, 0) if spec.order == "sequential" else b
            reps_seen[arm] = rep + 1
            if spec.restart in ("arm", "block"):
                group += 1
            block_of_rep = None if spec.order == "sequential" else rep
            for load in loads:
                if spec.restart == "run":
                    group += 1
                add(arm, load, rep=rep, block=block_of_rep, group=group)
    return runs
