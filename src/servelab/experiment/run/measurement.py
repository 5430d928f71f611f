"""What measuring one run gives the runner (`Measurement`) and the shapes of the functions that
measure (run/measure.py; tests pass their own to the Runner)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from servelab.experiment.design.model import ExperimentSpec
from servelab.experiment.plan.schedule import PlannedRun


@dataclass(frozen=True, slots=True)
class Measurement:
    """What one load point against a live server gave."""

    summary: dict[str, Any]
    records: list[dict[str, Any]]
    server_info: dict[str, Any] = field(default_factory=dict)
    bench: dict[str, Any] = field(default_factory=dict)  # the bench configuration used
    # a capacity sweep's other load points (summary, records, load_key, concurrency,
    # request_rate), each stored as an ordinary load point beside the run's own
    extra_points: list[dict[str, Any]] = field(default_factory=list)
    telemetry: dict[str, Any] | None = None  # the series over the load (telemetry/point.py)


MeasureFn = Callable[[str, ExperimentSpec, PlannedRun], Measurement]
# the capacity sweeps of a block's arms measured together (run/sweeps.py
# measure_paired): (url, spec, run) per arm -> a Measurement or the exception, per arm
PairedFn = Callable[[Sequence[tuple[str, ExperimentSpec, PlannedRun]],
                     Callable[[PlannedRun, str, str], None] | None],
                    list["Measurement | BaseException"]]


def served_model(spec: ExperimentSpec) -> str | None:
    if spec.engine in ("sglang", "vllm"):
        name = spec.base.flags.get("served-model-name")
        return str(name) if name else spec.model
    return None
