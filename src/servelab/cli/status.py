"""CLI verb: `servelab status [NAME]`: progress of running and detached jobs (experiments, tuning)."""

from __future__ import annotations

import time

import typer


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def register(app: typer.Typer) -> None:
    @app.command()
    def status(
        name: str = typer.Argument(None, help="Show one job only."),
        as_json: bool = typer.Option(False, "--json", help="Print the jobs as JSON (docs/JSON.md)."),
    ) -> None:
        """Show running and finished jobs: progress, what runs now, and an ETA."""
        from rich.table import Table

        from servelab import jobs
        from servelab.cli.console import make_console
        from servelab.errors import UserError

        states = jobs.read_all(name)
        if name and not states:
            known = ", ".join(s.name for s in jobs.read_all()) or "none"
            raise UserError(f"no job named '{name}' (known: {known})")
        if as_json:
            from servelab import jsonout

            return jsonout.emit("jobs", jsonout.jobs(states, time.time()))
        table = Table(title="servelab jobs")
        for col in ("name", "kind", "state", "progress", "failed", "now", "elapsed", "ETA", "log"):
            table.add_column(col)
        now = time.time()
        for st in states:
            end = st.updated if st.state != "running" else now
            table.add_row(
                st.name, st.kind, st.state, f"{st.done}/{st.total}", str(st.failed), st.current,
                _fmt_s(end - st.started), _fmt_s(st.eta_s) if st.state == "running" else "-",
                st.log or "",
            )
        make_console().print(table)
