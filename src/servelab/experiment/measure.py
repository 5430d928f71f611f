"""How the runner measures one run: a load point with servelab.bench, or a capacity sweep
(experiment/capacity.py); tests pass their own functions of these shapes to the Runner."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from servelab.experiment.schedule import PlannedRun
from servelab.experiment.spec import ExperimentSpec


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


MeasureFn = Callable[[str, ExperimentSpec, PlannedRun], Measurement]
# the capacity sweeps of a block's arms measured together (experiment/capacity.py
# measure_paired): (url, spec, run) per arm -> a Measurement or the exception, per arm
PairedFn = Callable[[Sequence[tuple[str, ExperimentSpec, PlannedRun]],
                     Callable[[PlannedRun, str, str], None] | None],
                    list["Measurement | BaseException"]]


def served_model(spec: ExperimentSpec) -> str | None:
    if spec.engine in ("sglang", "vllm"):
        name = spec.base.flags.get("served-model-name")
        return str(name) if name else spec.model
    return None


def bench_measure(url: str, spec: ExperimentSpec, run: PlannedRun) -> Measurement:
    """One load point with servelab.bench: the same prompts for every arm and repetition of it."""
    from dataclasses import asdict

    from servelab.bench.config import LoadPoint
    from servelab.bench.run import run_load_point
    from servelab.experiment.spec import SWEEP_KEY

    if run.load_key == SWEEP_KEY:  # one capacity search (experiment/capacity.py)
        from servelab.experiment import capacity

        return capacity.measure(url, spec, run)
    cfg = spec.workload.bench_config(url, model=served_model(spec))
    load = LoadPoint(
        concurrency=run.concurrency, request_rate=run.request_rate, burstiness=spec.load.burstiness
    )
    res = run_load_point(cfg, load, progress=False)
    return Measurement(
        summary=dict(res.summary),
        records=list(res.records),
        server_info=dict(res.server_info or {}),
        bench=asdict(cfg),
    )
