"""`[load.sweep]` of an experiment file: each run is a capacity search under SLOs
(experiment/run/sweeps.py measures it; docs/METRICS.md, "Capacity in experiments")."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from servelab.bench.slo import parse_slo
from servelab.errors import UserError
from servelab.experiment.design.base import Strict

SWEEP_KEY = "capacity"  # the load key of a capacity sweep's runs


class SweepSpec(Strict):
    """`[load.sweep]`: each run is a capacity search (bench/sweep.py) under `slo`; every point
    it measures is an ordinary stored load point (docs/METRICS.md, "Capacity under SLOs")."""

    slo: str  # e.g. "ttft_p99_ms=2000,tpot_p99_ms=50" or per request "ttft:500 tpot:50"
    precision: float = Field(0.1, ge=0.001, le=1.0, allow_inf_nan=False)
    rates: int = Field(3, ge=0, le=20, strict=True)  # grid rates between sync and saturated
    max_points: int = Field(12, ge=2, le=100, strict=True)
    # with restart = "block" (every arm up at once): the arms' sweeps alternate point by point,
    # so drift over minutes reaches both (experiment/run/sweeps.py measure_paired); otherwise
    # (and with false) each run's sweep runs to its end before the next run starts
    paired: bool = Field(True, strict=True)

    @field_validator("slo")
    @classmethod
    def _slo(cls, v: str) -> str:
        try:
            if parse_slo(v) is None:
                raise ValueError("give at least one SLO, e.g. \"ttft_p99_ms=2000,tpot_p99_ms=50\"")
        except UserError as exc:
            raise ValueError(str(exc).replace("--slo", "slo")) from None
        return v

    @model_validator(mode="after")
    def _room(self) -> SweepSpec:
        if self.max_points < 2 + self.rates:
            raise ValueError(f"max_points {self.max_points} leaves no room for the synchronous, "
                             f"saturated and {self.rates} grid points: give >= {2 + self.rates}")
        return self
