"""The record of a run: each measured run (or its failure) stored in the results store as it
finishes, with its provenance (the processes, the server, the bench configuration, the
machine's interference and the cores it ran on), and said in one line. The runner (runner.py)
decides what to run; this is what it keeps of each."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from servelab import provenance
from servelab.engines.base import Engine
from servelab.experiment.deploy.deployment import Deployment
from servelab.experiment.design.metrics import METRICS, metric_value
from servelab.experiment.design.model import ExperimentSpec
from servelab.experiment.plan.schedule import PlannedRun
from servelab.experiment.run import interference, pinning
from servelab.experiment.run.measurement import Measurement
from servelab.store import Store


class Recorder:
    """Stores the runs of one experiment; `say` gets the plain-text line of each."""

    def __init__(self, spec: ExperimentSpec, store: Store, engine: Engine,
                 say: Callable[[str], None]) -> None:
        self.spec, self.store, self.engine, self.say = spec, store, engine, say
        self.pause_note: tuple[float, str] | None = None  # for the next run's record

    def store_run(self, p: PlannedRun, **outcome: Any) -> None:
        """Store one planned run: its place in the plan plus `outcome` (status, error, ...)."""
        self.store.add_run(
            experiment=self.spec.name,
            arm=p.arm,
            load_key=p.load_key,
            repetition=p.repetition,
            block=p.block,
            seq=p.seq,
            **outcome,
        )

    def failed(self, p: PlannedRun, error: str, log_tail: str,
                started: float | None = None) -> None:
        """Store a run that produced no load point (`started` defaults to now) and say why."""
        self.store_run(
            p,
            status="failed",
            error=error,
            log_tail=log_tail,
            started=time.time() if started is None else started,
        )
        self.say(f"failed {p.describe()}: {error}")

    def measured(self, p: PlannedRun, url: str, dep: Deployment | None,
                 m: Measurement | BaseException, before: Any, inter: dict[str, Any],
                 started: float, pins: pinning.PinPlan) -> str:
        """Store one measured run (or its failure) with its provenance; its status."""
        spec = self.spec
        if isinstance(m, BaseException):
            why = dep.lost() if dep else None
            self.failed(p, f"during the run: {why}" if why else f"{type(m).__name__}: {m}",
                         dep.log_tail() if dep else "", started)
            return "failed"
        if dep and (why := dep.lost()):  # a process (or its node) lost mid-run: not a result
            self.failed(p, f"during the run: {why}", dep.log_tail(), started)
            return "failed"
        window = self.engine.acceptance(before, self.engine.scrape(url))
        summary = dict(m.summary)
        if summary.get("accept_length") is None and window["accept_length"] is not None:
            summary["accept_length"] = window["accept_length"]
            summary["accept_length_source"] = window["source"]
        info = self.engine.info(url) or m.server_info or None
        prov = provenance.collect(
            experiment=spec.name,
            arm=p.arm,
            repetition=p.repetition,
            block=p.block,
            seq=p.seq,
            engine=spec.engine,
            model=spec.model,
            processes=dep.argvs if dep else None,
            server_info=info,
            bench=m.bench,
            workload=spec.workload.model_dump(mode="json"),
            spec_window=window,
            interference=inter,
            pinning={
                **pins.to_json(),
                "client_actual": pinning.affinity(os.getpid()),
                "engine_actual": pinning.affinity(dep.pids()[0]) if dep and dep.pids() else None,
            },
        )
        ids = [
            self.store.add_load_point(
                summary=x["summary"], provenance=prov, load_key=x["load_key"],
                source="experiment", label=f"{spec.name}/{p.arm}", base_url=url,
                model=spec.model or None, concurrency=x["concurrency"],
                request_rate=x["request_rate"], requests=x["records"],
                telemetry=x.get("telemetry"),
            )
            for x in m.extra_points
        ]
        if ids:
            summary["sweep_point_ids"] = ids
        at = (summary.get("capacity") or {}).get("load") or {}  # a sweep: the point at capacity
        lp = self.store.add_load_point(
            summary=summary,
            provenance=prov,
            load_key=at.get("key", p.load_key),
            source="experiment",
            label=f"{spec.name}/{p.arm}",
            base_url=url,
            model=spec.model or None,
            concurrency=at.get("concurrency", p.concurrency),
            request_rate=at.get("request_rate", p.request_rate),
            requests=m.records,
            telemetry=m.telemetry,
        )
        completed = summary.get("completed") or 0
        status = "ok" if completed > 0 else "failed"
        error = (
            None if status == "ok" else f"no request completed ({summary.get('failure_reasons')})"
        )
        self.store_run(
            p,
            status=status,
            load_point_id=lp,
            error=error,
            log_tail=(dep.log_tail() if dep else None) if error else None,
            started=started,
        )
        if inter.get("flagged"):
            self.say(f"interference: {p.describe()}: {inter['flagged']}")
        # the metric where the statistics read it (TTFT's median, not its stats object)
        value = metric_value(summary, spec.primary_metric)
        self.say(
            f"{'ok' if status == 'ok' else 'failed'} {p.describe()}: "
            f"{spec.primary_metric} {_fmt(value)} {METRICS[spec.primary_metric].unit}, "
            f"{completed} requests ok, "
            f"{summary.get('failed') or 0} failed ({time.time() - started:.1f} s; other "
            f"processes {_fmt(inter.get('other_cpu_cores'))} cores)"
            + (f": {error}" if error else "")
        )
        return status

    def interference(self, snap: interference.Snapshot, pids: list[int]) -> dict[str, Any]:
        """The record of the run just measured, flagged against the spec's thresholds."""
        n = self.spec.noise
        rec = interference.record(snap, interference.snapshot(pids))
        out = rec.to_json()
        out["flagged"] = interference.crossed(rec, n.max_other_cpu, n.max_steal)
        if self.pause_note:
            out["paused_s"], out["pause_reason"] = self.pause_note
            self.pause_note = None
        return out


def _fmt(x: object) -> str:
    return f"{x:.4g}" if isinstance(x, int | float) and x == x else "n/a"  # NaN: n/a
