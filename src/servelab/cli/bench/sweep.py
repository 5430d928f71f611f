"""`servelab bench --sweep`: run servelab.bench.sweep over the server, storing and printing each
point as it completes, then the sweep's table and capacity."""

from __future__ import annotations

import uuid
from typing import Any

from servelab.bench.run import run_load_point
from servelab.bench.sweep import SweepPoint
from servelab.bench.sweep import sweep as run_sweep
from servelab.cli.bench.output import Recorder, point_line, sweep_table
from servelab.cli.bench.plan import Plan


def measure_sweep(plan: Plan, rec: Recorder, quiet: bool) -> None:
    """Sweep under plan.slos; every point goes to the store and --output under one sweep id
    (also the store label unless --label gives one)."""
    assert plan.sweep is not None
    cfg, slos, console = plan.cfg, plan.slos, rec.console
    sweep_id = "sweep-" + uuid.uuid4().hex[:8]
    rec.label = rec.label or sweep_id
    sweep_doc: dict[str, Any] = {"id": sweep_id, "slo": slos.to_dict() if slos else None,
                                 "capacity": None, "points": []}
    rec.sweep_doc = sweep_doc
    results: dict[str, Any] = {}

    def measure(lp: Any) -> dict[str, Any]:
        res = run_load_point(cfg, lp, progress=not quiet)
        results[lp.key] = res
        return res.summary

    def on_point(p: SweepPoint) -> None:
        res = results.pop(p.load.key)
        c = p.check
        res.summary["sweep"] = {"id": sweep_id, "role": p.role,
                                "slo_met": None if c is None else c.met,
                                "slo_ratio": None if c is None else c.ratio}
        sweep_doc["points"].append({"role": p.role, "load_key": p.load.key,
                                    "slo_met": None if c is None else c.met,
                                    "slo_reasons": [] if c is None else list(c.reasons)})
        row = rec.keep(p.load, res, line=lambda row: point_line(p, row))
        sweep_doc["points"][-1]["store_id"] = row
        rec.write_output()

    console.print(f"sweep {sweep_id}" + (f" under {slos.describe()}" if slos else "")
                  + f" against {cfg.shown_url}", markup=False, highlight=False)
    result = run_sweep(measure, plan.sweep, on_point)
    console.print(sweep_table(result, slos))
    sweep_doc.update({"synchronous_req_s": result.synchronous_req_s,
                      "saturated_req_s": result.saturated_req_s,
                      "notes": list(result.notes),
                      "capacity": result.capacity.to_dict() if result.capacity else None})
    for n in result.notes:
        console.print(f"note: {n}", style="yellow")
    if result.capacity is not None:
        console.print(f"capacity: {result.capacity.describe()}", style="bold")
        for n in result.capacity.notes:
            console.print(f"  {n}", markup=False, highlight=False)
    rec.write_output()
