"""One ok run as the statistics see it: its place in the schedule and its stored summary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RunValue:
    """One ok run's summary, reduced to what statistics need."""

    arm: str
    load_key: str
    repetition: int
    block: int | None
    summary: dict[str, Any]
