"""CLI verbs of controlled experiments: `run FILE [--detach]`, `report NAME`, `compare A B`,
`demo`."""

from __future__ import annotations

from pathlib import Path

import typer

from servelab.cli.results import JSON_HELP, STORE_HELP


def run(
    file: Path = typer.Argument(..., help="Experiment file (TOML); see docs/EXPERIMENTS.md."),
    detach: bool = typer.Option(
        False, "--detach", help="Run in the background; follow with `servelab status NAME`."
    ),
    store: Path = typer.Option(None, "--store", help=STORE_HELP),
    check: bool = typer.Option(
        False, "--check", help="Only validate the file and print the plan: per arm and "
        "process the exact command, environment and the engine parser's verdict."
    ),
    fresh: bool = typer.Option(
        False, "--fresh", help="Forget this experiment's stored runs first and start over."
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Run a controlled experiment (resumes where an interrupted one stopped)."""
    from servelab import jobs
    from servelab.cli.console import make_console
    from servelab.experiment.plan.preflight import load
    from servelab.experiment.present import attribution, run_file
    from servelab.experiment.report.data import collect
    from servelab.store import Store

    spec = load(file)
    console = make_console(stderr=as_json)  # --json: stdout holds the document only
    if check:
        from servelab.experiment.plan import check as check_mod
        from servelab.experiment.present import plan_lines

        data = check_mod.collect(spec, str(file))
        if as_json:
            from servelab import jsonout

            data["stopping_and_noise"] = plan_lines(spec)
            typer.echo(jsonout.dumps(jsonout.document("experiment_check", data)))
        else:
            for line in check_mod.lines(data) + plan_lines(spec):
                console.print(line, highlight=False, markup=False, soft_wrap=True)
        return
    if fresh:
        with Store(store) as st:
            st.forget_experiment(spec.name)
        console.print(f"forgot the stored runs of '{spec.name}'", highlight=False)
    if detach:
        argv = ["run", str(file.resolve())] + (
            ["--store", str(store.resolve())] if store else []
        )
        pid, log = jobs.detach(argv, spec.name)
        console.print(
            f"experiment '{spec.name}' runs in the background (pid {pid}); log {log}\n"
            f"progress: servelab status {spec.name}",
            highlight=False,
        )
        return
    res = run_file(spec, store, console)
    with Store(store) as st:
        # the band in the file as it is now (a resume may have changed it; the store keeps the
        # spec as first run)
        data = collect(st, spec.name, spec.noise_band)
        attribution(console, data)
    if as_json:
        from servelab import jsonout
        from servelab.experiment.report.document import experiment_document

        jsonout.emit("experiment", experiment_document(data))
    console.print(f"report: servelab report {spec.name}", highlight=False)
    if res.failed and not res.ok:  # scripts must see that nothing of this session succeeded
        raise typer.Exit(1)

def report(
    name: str = typer.Argument(..., help="Experiment name."),
    out: Path = typer.Option(None, "--out", help="Folder for report.md and report.html."),
    store: Path = typer.Option(None, "--store", help=STORE_HELP),
    noise_band: float = typer.Option(
        None,
        "--noise-band",
        help="Relative band treated as noise for the verdicts, e.g. 0.05 for +-5% "
        "(default: the experiment file's noise_band).",
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Write an experiment's report: markdown and one self-contained HTML file."""
    from servelab.cli.console import make_console
    from servelab.errors import UserError
    from servelab.experiment.present import attribution
    from servelab.experiment.report.html import write
    from servelab.store import Store

    if noise_band is not None and not 0 <= noise_band < 1:
        raise UserError(f"--noise-band {noise_band:g}: give a fraction in [0, 1), e.g. 0.02")
    console = make_console(stderr=as_json)
    with Store(store) as st:
        md, page, data = write(st, name, out, noise_band)
    if as_json:
        from servelab import jsonout
        from servelab.experiment.report.document import experiment_document

        files = {"html": str(page), "markdown": str(md)}
        return jsonout.emit("experiment", experiment_document(data, files))
    attribution(console, data)
    console.print(f"report: {page}\nmarkdown: {md}", highlight=False)

def compare(
    a: str = typer.Argument(
        ..., help="Load point id (servelab results) or a bench --output JSON file."
    ),
    b: str = typer.Argument(..., help="The same for the other side (B is compared against A)."),
    store: Path = typer.Option(None, "--store", help=STORE_HELP),
    noise_band: float = typer.Option(
        0.02, "--noise-band", help="Relative band treated as noise."
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Compare two bench results metric by metric (B relative to A)."""
    from servelab.cli.console import make_console
    from servelab.experiment.present import verdict_table
    from servelab.experiment.report.compare import compare as do_compare
    from servelab.store import Store

    with Store(store) as st:
        res = do_compare(st, a, b, noise_band=noise_band)
    if as_json:
        from servelab import jsonout

        return jsonout.emit("compare", jsonout.compare(res, noise_band))
    console = make_console()
    title = f"B = {res.b_name} vs A = {res.a_name} ({res.load_key})"
    console.print(verdict_table(title, res.rows, lambda r: r[-1].split(" ")[0]))
    for w in res.warnings:
        console.print(f"warning: {w}", style="yellow")

def demo(
    quick: bool = typer.Option(
        False, "--quick", help="A shortened variant (CI): fewer prompts."
    ),
    store: Path = typer.Option(None, "--store", help=STORE_HELP),
    file: Path = typer.Option(
        None, "--file", help="Experiment file (default: examples/demo.toml)."
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """The story's MTP A/B in miniature on the embedded engine: run, attribute, report."""
    from servelab.cli.console import make_console
    from servelab.experiment.demo import run_demo

    run_demo(make_console(stderr=as_json), quick=quick, store_path=store, file=file,
             as_json=as_json)


def register(app: typer.Typer) -> None:
    """The experiment verbs on the servelab app."""
    app.command("run")(run)
    app.command("report")(report)
    app.command("compare")(compare)
    app.command("demo")(demo)
