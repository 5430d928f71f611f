"""CLI verbs of controlled experiments: `run FILE [--detach]`, `report NAME`, `compare A B`,
`demo`."""

from __future__ import annotations

from pathlib import Path

import typer

from servelab.cli.results import STORE_HELP


def _verdict_table(title: str, rows: list, verdict):
    """A Rich table of `rows` (header first), each row green or red by `verdict(row)`."""
    from rich.table import Table

    table = Table(title=title)
    for h in rows[0]:
        table.add_column(h)
    style = {"better": "green", "worse": "red"}
    for r in rows[1:]:
        table.add_row(*r, style=style.get(verdict(r)))
    return table


def _attribution(console, data) -> None:
    from servelab.experiment.report import attribution_rows
    from servelab.experiment.stats import headline

    title = f"attribution: {data.name} (noise band +-{data.analysis.noise_band * 100:g}%)"
    console.print(_verdict_table(title, attribution_rows(data), lambda r: r[5]))
    for line in headline(data.analysis, data.primary):
        console.print(line, highlight=False)
    for w in data.analysis.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}", highlight=False)


def run_file(spec, store_path: Path | None, console, quiet: bool = False):
    """Run (or resume) an experiment in the foreground with a progress bar; the RunnerResult."""
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from servelab.experiment.runner import Runner
    from servelab.store import Store

    with Store(store_path) as store:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=quiet,
        ) as prog:
            task = prog.add_task(spec.name, total=None)

            def on_progress(done: int, total: int, what: str) -> None:
                prog.update(task, completed=done, total=total, description=f"{spec.name}: {what}")

            return Runner(
                spec,
                store,
                say=lambda s: console.print(s, highlight=False),
                on_progress=on_progress,
            ).run(job_log=_detached_log(spec.name))


def _detached_log(name: str) -> str | None:
    """The job log when stdout is it (a `--detach`ed run), so `servelab status` can show it."""
    import os

    from servelab import jobs

    log = jobs.log_path(name)
    try:
        out, st = os.fstat(1), log.stat()
    except OSError:
        return None
    return str(log) if (out.st_dev, out.st_ino) == (st.st_dev, st.st_ino) else None


def register(app: typer.Typer) -> None:
    @app.command("run")
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
        as_json: bool = typer.Option(False, "--json", help="With --check: the plan as JSON."),
        fresh: bool = typer.Option(
            False, "--fresh", help="Forget this experiment's stored runs first and start over."
        ),
    ) -> None:
        """Run a controlled experiment (resumes where an interrupted one stopped)."""
        from servelab import jobs
        from servelab.cli.console import make_console
        from servelab.experiment import spec as spec_mod
        from servelab.experiment.report import collect
        from servelab.store import Store

        spec = spec_mod.load(file)
        console = make_console()
        if check:
            from servelab.experiment import check as check_mod

            data = check_mod.collect(spec)
            if as_json:
                import json

                typer.echo(json.dumps(data, indent=1))
            else:
                for line in check_mod.lines(data):
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
            _attribution(console, collect(st, spec.name, spec.noise_band))
        console.print(f"report: servelab report {spec.name}", highlight=False)
        if res.failed and not res.ok:  # scripts must see that nothing of this session succeeded
            raise typer.Exit(1)

    @app.command("report")
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
    ) -> None:
        """Write an experiment's report: markdown and one self-contained HTML file."""
        from servelab.cli.console import make_console
        from servelab.errors import UserError
        from servelab.experiment.report import write
        from servelab.store import Store

        if noise_band is not None and not 0 <= noise_band < 1:
            raise UserError(f"--noise-band {noise_band:g}: give a fraction in [0, 1), e.g. 0.02")
        console = make_console()
        with Store(store) as st:
            md, page, data = write(st, name, out, noise_band)
        _attribution(console, data)
        console.print(f"report: {page}\nmarkdown: {md}", highlight=False)

    @app.command("compare")
    def compare(
        a: str = typer.Argument(
            ..., help="Load point id (servelab results) or a bench --output JSON file."
        ),
        b: str = typer.Argument(..., help="The same for the other side (B is compared against A)."),
        store: Path = typer.Option(None, "--store", help=STORE_HELP),
        noise_band: float = typer.Option(
            0.02, "--noise-band", help="Relative band treated as noise."
        ),
    ) -> None:
        """Compare two bench results metric by metric (B relative to A)."""
        from servelab.cli.console import make_console
        from servelab.experiment.compare import compare as do_compare
        from servelab.store import Store

        with Store(store) as st:
            res = do_compare(st, a, b, noise_band=noise_band)
        console = make_console()
        title = f"B = {res.b_name} vs A = {res.a_name} ({res.load_key})"
        console.print(_verdict_table(title, res.rows, lambda r: r[-1].split(" ")[0]))
        for w in res.warnings:
            console.print(f"[yellow]warning:[/yellow] {w}", highlight=False)

    @app.command("demo")
    def demo(
        quick: bool = typer.Option(
            False, "--quick", help="A shortened variant (CI): fewer prompts."
        ),
        store: Path = typer.Option(None, "--store", help=STORE_HELP),
        file: Path = typer.Option(
            None, "--file", help="Experiment file (default: examples/demo.toml)."
        ),
    ) -> None:
        """The story's MTP A/B in miniature on the embedded engine: run, attribute, report."""
        from servelab.cli.console import make_console
        from servelab.experiment.demo import run_demo

        run_demo(make_console(), quick=quick, store_path=store, file=file)
