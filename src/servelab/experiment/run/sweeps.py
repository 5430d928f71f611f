"""SLO capacity as an experiment measurement: a run of load key `capacity` (`[load.sweep]`) is
one capacity search (bench/sweep.py) against the arm's deployment (docs/METRICS.md, "Capacity
under SLOs", and docs/EXPERIMENTS.md). This module is the measuring half; the statistics of the
brackets it stores are stats/capacity.py.

A run's stored load point is the sweep's point AT the capacity (the largest rate that met every
SLO; the synchronous point when none did), its summary carrying the bracket under `capacity`;
every other point of the sweep is stored as an ordinary load point beside it (ids under
`sweep_point_ids`). With `[load.sweep] paired` the sweeps of a block's arms alternate point by
point (`measure_paired`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

from servelab.bench.run import run_load_point
from servelab.bench.slo import parse_slo
from servelab.bench.sweep import SweepConfig, search
from servelab.errors import UserError
from servelab.experiment.design.model import ExperimentSpec
from servelab.experiment.plan.schedule import PlannedRun
from servelab.experiment.run.measurement import Measurement, served_model


class ArmSweep:
    """One arm's capacity search against `url` (bench/sweep.py `search`), measured one load
    point at a time by `step()`, so that a caller can alternate the searches of several arms."""

    def __init__(self, url: str, spec: ExperimentSpec, run: PlannedRun) -> None:
        sw = spec.load.sweep
        assert sw is not None, "a capacity run needs [load.sweep]"
        self.slo = parse_slo(sw.slo)
        cfg = spec.workload.bench_config(url, model=served_model(spec))
        if self.slo is not None and self.slo.goodput() and not cfg.goodput:
            cfg = replace(cfg, goodput=self.slo.goodput())
        self.cfg, self.run = cfg, run
        self.results: dict[str, Any] = {}
        self._search = search(SweepConfig(slo=self.slo, precision=sw.precision,
                                          grid_rates=sw.rates, max_points=sw.max_points,
                                          burstiness=spec.load.burstiness))
        self.next: Any = next(self._search)  # (role, LoadPoint) to measure; None when done
        self.result: Any = None

    def step(self) -> None:
        """Measure the next load point and advance the search (`next` None once it ended)."""
        _, lp = self.next
        res = run_load_point(self.cfg, lp, progress=False)
        self.results[lp.key] = res
        try:
            self.next = self._search.send(res.summary)
        except StopIteration as stop:
            self.next, self.result = None, stop.value
        except UserError as exc:  # e.g. no request completed: this run failed, not the experiment
            self.next = None
            raise RuntimeError(f"capacity sweep: {exc}") from None

    def measurement(self) -> Measurement:
        """The runner's Measurement: the point at capacity, the others as `extra_points`."""
        result, slo, cfg, results = self.result, self.slo, self.cfg, self.results
        assert result is not None, "the search has not ended"
        cap = result.capacity
        assert cap is not None  # a sweep with SLOs always brackets (or bounds) a capacity
        at = _point_at_capacity(result)
        points = []
        for p in result.points:
            res = results[p.load.key]
            summary = dict(res.summary)
            summary["sweep"] = {"role": p.role, "slo_met": p.check.met if p.check else None,
                                "slo_ratio": p.check.ratio if p.check else None,
                                "slo_reasons": list(p.check.reasons) if p.check else []}
            points.append((p, summary, res))
        main = next(x for x in points if x[0] is at)
        summary = dict(main[1])
        summary["capacity"] = {**cap.to_dict(), "slo": slo.to_dict() if slo else None,
                               "slo_text": slo.describe() if slo else "",
                               "synchronous_req_s": result.synchronous_req_s,
                               "saturated_req_s": result.saturated_req_s,
                               "load": {"key": at.load.key, "concurrency": at.load.concurrency,
                                        "request_rate": at.load.request_rate},
                               "sweep_notes": list(result.notes)}
        extra = [{"summary": s, "records": list(r.records), "load_key": p.load.key,
                  "concurrency": p.load.concurrency, "request_rate": p.load.request_rate,
                  "telemetry": r.telemetry}
                 for p, s, r in points if p is not at]
        return Measurement(summary=summary, records=list(main[2].records),
                           server_info=dict(main[2].server_info or {}), bench=asdict(cfg),
                           extra_points=extra, telemetry=main[2].telemetry)


def measure(url: str, spec: ExperimentSpec, run: PlannedRun) -> Measurement:
    """One capacity sweep against `url` (the runner's MeasureFn for load key `capacity`):
    returns the runner's Measurement for the point at capacity, the others as `extra_points`."""
    arm = ArmSweep(url, spec, run)
    while arm.next is not None:
        arm.step()
    return arm.measurement()


def measure_paired(items: Sequence[tuple[str, ExperimentSpec, PlannedRun]],
                   on_point: Callable[[PlannedRun, str, str], None] | None = None
                   ) -> list[Measurement | BaseException]:
    """The capacity sweeps of several arms of one block, `(url, spec, run)` each, alternating
    point by point (`[load.sweep] paired`): the first arm's first point, the second arm's first
    point, the first arm's second point, ... until every search has ended; a search that ends
    early leaves the others alternating among themselves. Each arm still bisects its own
    crossing, but its k-th point runs seconds, not a whole sweep, away from the other arm's k-th:
    a machine whose speed drifts over minutes moves both arms' capacities together, and their
    ratio (what the experiment compares) keeps less of the drift.

    Returns one Measurement per item, or the exception that broke that arm's sweep (the other
    arms go on); Ctrl-C, SystemExit and configuration errors (UserError) propagate.
    `on_point(run, role, load_key)` is told before each point is measured (progress)."""
    arms: list[ArmSweep | BaseException] = []
    for url, spec, run in items:
        try:
            arms.append(ArmSweep(url, spec, run))
        except (KeyboardInterrupt, SystemExit, UserError):
            raise
        except Exception as exc:
            arms.append(exc)
    while True:
        live = [i for i, a in enumerate(arms) if isinstance(a, ArmSweep) and a.next is not None]
        if not live:
            break
        for i in live:
            a = arms[i]
            assert isinstance(a, ArmSweep) and a.next is not None
            if on_point is not None:
                on_point(a.run, a.next[0], a.next[1].key)
            try:
                a.step()
            except (KeyboardInterrupt, SystemExit, UserError):
                raise
            except Exception as exc:  # this arm's run failed; the others go on
                arms[i] = exc
    out = [a.measurement() if isinstance(a, ArmSweep) else a for a in arms]
    whole = [run.arm for m, (_, _, run) in zip(out, items, strict=True)
             if not isinstance(m, BaseException)]
    for m, (_, _, run) in zip(out, items, strict=True):
        if not isinstance(m, BaseException):  # the report says which sweeps ran paired
            m.summary["capacity"]["paired_with"] = [a for a in whole if a != run.arm]
    return out


def _point_at_capacity(result: Any) -> Any:
    """The measured point at the bracket's low end (the synchronous point when none met)."""
    cap = result.capacity
    if cap.low_req_s:
        for p in result.points:
            if p.load.request_rate is not None and math.isclose(p.load.request_rate, cap.low_req_s):
                return p
    return result.points[0]
