"""Console presentation of experiments, below the CLI so that `servelab demo` and the CLI verbs
share it without anything importing the CLI: the attribution table and running an experiment in
the foreground with a progress bar."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servelab import jobs
from servelab.console import literal
from servelab.experiment.design.model import ExperimentSpec
from servelab.experiment.report.noise import stopping_lines
from servelab.experiment.report.sections import sections
from servelab.experiment.report.tables import attribution_rows, verdict_word
from servelab.experiment.run.runner import Runner
from servelab.experiment.stats import sequential as seq
from servelab.experiment.stats.analysis import headline
from servelab.experiment.stats.evidence import Evidence, design_of
from servelab.store import Store


def verdict_table(title: str, rows: list[list[str]], verdict: Callable[[list[str]], str]) -> Any:
    """A Rich table of `rows` (header first), each row green or red by `verdict(row)`. Cells are
    literal text (no markup): arm names and labels come from files."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(title))
    for h in rows[0]:
        table.add_column(Text(h))
    style = {"better": "green", "worse": "red"}
    for r in rows[1:]:
        table.add_row(*(Text(c) for c in r), style=style.get(verdict(r)))
    return table


def attribution(console: Any, data: Evidence) -> None:
    """Print the attribution table, the headline, the stopping rule's outcome and warnings."""
    from rich.text import Text

    title = f"attribution: {data.name} (noise band +-{data.analysis.noise_band * 100:g}%)"
    rows = attribution_rows(data)
    console.print(verdict_table(title, rows, lambda r: verdict_word(rows, r)))
    for line in headline(data.analysis, data.primary) + stopping_lines(data):
        console.print(Text(line))
    for e in sections(data)[1]:  # SLO capacity ([load.sweep]): the sentence a reader wants
        console.print(Text(e.sentence(), style="bold"))
    for w in data.analysis.warnings:
        console.print(Text.assemble(("warning: ", "yellow"), w))


def run_file(spec: ExperimentSpec, store_path: Path | None, console: Any, quiet: bool = False):
    """Run (or resume) an experiment in the foreground with a progress bar; the RunnerResult."""
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Store(store_path) as store:
        with Progress(
            TextColumn("{task.description}", markup=False),
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
                say=printer(console),
                on_progress=on_progress,
            ).run(job_log=detached_log(spec.name))


# the runner's lines are plain text (outside text inside them: arm names, server errors): they
# are printed literally and styled by their first word, never parsed as markup
_STYLES = (("failed ", "red"), ("pausing: ", "yellow"), ("warning: ", "yellow"),
           ("interference: ", "yellow"), ("launch of arm ", "yellow"))


def printer(console: Any) -> Callable[[str], None]:
    """The runner's `say` for a console: each line literal (controls escaped), styled by its
    first word."""
    from rich.text import Text

    def say(line: str) -> None:
        style = next((st for head, st in _STYLES if line.startswith(head)), "")
        console.print(Text(literal(line, keep_newlines=True), style=style))

    return say


def detached_log(name: str) -> str | None:
    """The job log when stdout is it (a `--detach`ed run), so `servelab status` can show it."""
    log = jobs.log_path(name)
    try:
        out, st = os.fstat(1), log.stat()
    except OSError:
        return None
    return str(log) if (out.st_dev, out.st_ino) == (st.st_dev, st.st_ino) else None


def plan_lines(spec: ExperimentSpec) -> list[str]:
    """What `run --check` adds below the schedule: the stopping rule and the noise control."""
    out = []
    if spec.adaptive_on:
        a = spec.adaptive
        design = design_of(spec)
        assert design is not None
        secondary = design.secondary_keys([k for k, _, _ in spec.load.keys()])
        out.append(
            f'repetitions = "auto": blocks {a.min} to {a.max} (the schedule lists the most), '
            "stop when "
            + (
                "the primary effect is"
                if design.effects == 1
                else f"all {design.effects} primary effects are"
            )
            + f" decided or after "
            f"{a.budget_s:g} s; rule: {seq.rule_text(design)}, familywise alpha {a.alpha:g}, "
            f"each look at {design.levels_text()}"
            + (f"; secondary (not waited for): {', '.join(secondary)}" if secondary else "")
        )
    n = spec.noise
    extra = f", up to {n.max_repeats} extra blocks" if n.on_interference == "repeat" else ""
    out.append(
        f"noise control: pin = {n.pin}; interference thresholds other CPU "
        f"{n.max_other_cpu if n.max_other_cpu is not None else '-'} cores, steal "
        f"{n.max_steal if n.max_steal is not None else '-'}; on interference: "
        f"{n.on_interference}{extra}"
    )
    return out
