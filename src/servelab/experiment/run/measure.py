"""How the runner measures one run: a load point with servelab.bench, or a capacity sweep
(run/sweeps.py); tests pass their own functions of these shapes to the Runner
(run/measurement.py)."""

from __future__ import annotations

from dataclasses import asdict

from servelab.bench.config import LoadPoint
from servelab.bench.run import run_load_point
from servelab.experiment.design.model import ExperimentSpec
from servelab.experiment.design.sweep import SWEEP_KEY
from servelab.experiment.plan.schedule import PlannedRun
from servelab.experiment.run import sweeps
from servelab.experiment.run.measurement import Measurement, served_model


def bench_measure(url: str, spec: ExperimentSpec, run: PlannedRun) -> Measurement:
    """One load point with servelab.bench: the same prompts for every arm and repetition of it."""
    if run.load_key == SWEEP_KEY:  # one capacity search (run/sweeps.py)
        return sweeps.measure(url, spec, run)
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
        telemetry=res.telemetry,
    )
