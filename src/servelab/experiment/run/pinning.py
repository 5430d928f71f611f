"""Pin the benchmark client and each engine to disjoint CPU cores (Linux sched_setaffinity).

Why: on a CPU target the client and the engine compete for the same cores, and the scheduler
moves them around; a run then measures the scheduler as much as the engine. Disjoint cores keep
the client's work out of the engine's time. `pin = "auto"` pins only when every process gets a
core of its own (one for the client, then an equal share for each arm's engine); `pin = true`
pins also on fewer cores (the engines then share the cores the client does not use); `false`
never. The plan is recorded in each run's provenance with the affinity the processes really got.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def available() -> list[int]:
    """The cores this process may use, sorted; empty where affinity is not supported."""
    if not hasattr(os, "sched_getaffinity"):
        return []
    return sorted(os.sched_getaffinity(0))


@dataclass(frozen=True, slots=True)
class PinPlan:
    """Which cores the client and each arm's engine get; `client` None: nothing is pinned."""

    client: tuple[int, ...] | None
    engines: dict[str, tuple[int, ...]] = field(default_factory=dict)
    note: str = ""

    @property
    def active(self) -> bool:
        return self.client is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "client": list(self.client) if self.client is not None else None,
            "engines": {k: list(v) for k, v in self.engines.items()},
            "note": self.note,
        }


def plan(mode: bool | str, arms: Sequence[str], cores: Sequence[int] | None = None) -> PinPlan:
    """The pinning of one block whose deployments are `arms` (all up at once with restart
    'block'; one at a time otherwise, which still gets each arm its own cores)."""
    cores = list(available() if cores is None else cores)
    need = 1 + len(arms)
    if mode is False:
        return PinPlan(None, {}, "pinning off (noise.pin = false)")
    if not hasattr(os, "sched_setaffinity") or len(cores) < 2:
        return PinPlan(None, {}, f"not pinned: {len(cores)} usable core(s), affinity needs 2")
    if mode == "auto" and len(cores) < need:
        return PinPlan(
            None,
            {},
            f"not pinned: the client and {len(arms)} engine(s) need {need} cores, "
            f"{len(cores)} usable (noise.pin = true shares the engines' cores)",
        )
    client, rest = (cores[0],), cores[1:]
    if len(rest) >= len(arms):
        share = len(rest) // len(arms)
        engines = {a: tuple(rest[i * share : (i + 1) * share]) for i, a in enumerate(arms)}
        note = f"client on core {cores[0]}; each engine on {share} core(s) of its own"
    else:
        engines = {a: tuple(rest) for a in arms}
        note = f"client on core {cores[0]}; the engines share cores {_span(rest)}"
    return PinPlan(client, engines, note)


def _span(cores: Iterable[int]) -> str:
    return ",".join(str(c) for c in cores)


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return [pid]


def pin(pids: Iterable[int], cores: Iterable[int]) -> None:
    """Set the affinity of every thread of every process in `pids` (gone ones are skipped)."""
    mask = set(cores)
    for pid in pids:
        for tid in _tasks(pid):
            try:
                os.sched_setaffinity(tid, mask)
            except (ProcessLookupError, PermissionError):
                continue


def affinity(pid: int) -> list[int] | None:
    """The cores `pid` may run on, or None when it is gone."""
    try:
        return sorted(os.sched_getaffinity(pid))
    except (ProcessLookupError, PermissionError, OSError):
        return None
