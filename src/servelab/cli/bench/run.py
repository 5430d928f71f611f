"""`servelab bench` once its flags are read: plan, measure each load point (or sweep), store,
print, write --output, and exit 1 when nothing was measured.

Sends `Authorization: Bearer $SERVELAB_API_KEY` (or $OPENAI_API_KEY) when set
(servelab.bench.client).
"""

from __future__ import annotations

import typer

from servelab import jsonout
from servelab.bench.run import run_load_point
from servelab.cli.bench.options import BenchArgs
from servelab.cli.bench.output import Recorder
from servelab.cli.bench.plan import make_plan
from servelab.cli.bench.sweep import measure_sweep
from servelab.cli.console import make_console
from servelab.store import Store


def execute(a: BenchArgs) -> None:
    """Run one `servelab bench` call (stdout: tables, or with --json one JSON document and the
    tables on stderr)."""
    plan = make_plan(a)
    st = None if a.no_store else Store(a.store)
    rec = Recorder(cfg=plan.cfg, output=plan.output, store=st,
                   console=make_console(stderr=a.as_json), label=a.label, vllm=plan.vllm)
    quiet = a.quiet or a.as_json
    if plan.sweep is None:
        for lp in plan.loads:
            rec.keep(lp, run_load_point(plan.cfg, lp, progress=not quiet))
            rec.write_output()
    else:
        measure_sweep(plan, rec, quiet)
    if st is not None:
        st.close()
    if a.as_json:
        jsonout.emit("bench", {"provenance": rec.provenance(), "load_points": rec.out,
                               "sweep": rec.sweep_doc})
    if all(s["completed"] == 0 for s in rec.out):
        raise typer.Exit(1)  # nothing was measured: let scripts notice
