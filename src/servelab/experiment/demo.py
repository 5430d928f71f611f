"""`servelab demo`: examples/demo.toml (baseline vs MTP on the embedded engine) end to end:
run, print the attribution table, write the report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from servelab import jobs, jsonout
from servelab.errors import UserError
from servelab.experiment.design.model import ExperimentSpec
from servelab.experiment.design.parse import from_store
from servelab.experiment.plan.preflight import load
from servelab.experiment.plan.schedule import plan
from servelab.experiment.present import attribution, run_file
from servelab.experiment.report.document import experiment_document
from servelab.experiment.report.html import write
from servelab.store import Store

ROOT = Path(__file__).resolve().parents[3]
DEMO_FILE = ROOT / "examples" / "demo.toml"


QUICK_WORKLOAD = {"input_len": 16, "output_len": 24, "num_prompts": 6, "warmup": 1}


def quick_variant(data: dict[str, Any]) -> dict[str, Any]:
    """The CI variant: the same design (arms, load points, interleaved blocks, stopping rule) with
    fewer and shorter requests and exactly three blocks, under its own experiment name."""
    q = dict(data)
    q["name"] = data["name"] + "-quick"
    q["workload"] = {**data.get("workload", {}), **QUICK_WORKLOAD}
    if data.get("repetitions") == "auto":  # three blocks exactly: a short run of the same rule
        q["adaptive"] = {**data.get("adaptive", {}), "min": 3, "max": 3}
    return q


def load_demo(file: Path | None, quick: bool) -> ExperimentSpec:
    path = Path(file) if file else DEMO_FILE
    if not path.is_file():
        raise UserError(
            f"demo file {path} not found; pass --file examples/demo.toml from a checkout"
        )
    return load(path, quick_variant if quick else None)


def run_demo(
    console: Any, *, quick: bool = False, store_path: Path | None = None, file: Path | None = None,
    as_json: bool = False,
) -> Path:
    """Run the demo (fresh unless an interrupted one can be resumed); returns the HTML path.
    `as_json`: the report's `experiment` document on stdout (`console` then writes to stderr)."""
    spec = load_demo(file, quick)
    t0 = time.monotonic()
    with Store(store_path) as st:
        if spec.name in st.experiment_names():
            ok = sum(r.status == "ok" for r in st.runs(spec.name))
            try:
                same = from_store(st.experiment(spec.name)).design_hash() == spec.design_hash()
            except ValueError:
                same = False
            states = [j.state for j in jobs.read_all(spec.name)]
            stopped = bool(states) and states[-1] in ("finished", "failed")
            if ok >= len(plan(spec)) or not same or stopped:
                # a finished (or redesigned) demo is measured afresh; an interrupted one resumes
                # (an adaptive demo finishes before its planned maximum: the job says it ended)
                st.forget_experiment(spec.name)
    run_file(spec, store_path, console)
    with Store(store_path) as st:
        md, page, data = write(st, spec.name)
    took = f"demo finished in {time.monotonic() - t0:.0f} s"
    if as_json:  # stdout holds the document only; the console writes to stderr
        console.print(took, highlight=False)
        jsonout.emit("experiment", experiment_document(data, {"html": str(page), "markdown": str(md)}))
    else:
        attribution(console, data)
        console.print(f"{took}\nreport: {page}\nmarkdown: {md}", highlight=False)
    return page
