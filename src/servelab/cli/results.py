"""CLI verbs: `servelab results list|show` (find stored load points again) and
`servelab import sglang|vllm|guidellm|aiperf|genai-perf|llmperf FILE` (bring other tools'
results into the store).
"""

from __future__ import annotations

import typer

from servelab.errors import UserError

JSON_HELP = "Print the result as one JSON document on stdout (docs/JSON.md)."
STORE_HELP = "Results database (default: results.db in $SERVELAB_HOME, else ~/.servelab)."

def _existing(store: str | None) -> str | None:
    """A --store to read must exist: opening it would create an empty database (and its
    folders), and a typo would read as "no load points stored yet"."""
    from pathlib import Path

    if store is not None and not Path(store).exists():
        raise UserError(f"--store {store}: no results store there; `servelab bench` or "
                        "`servelab import` creates one (leave --store out for the default)")
    return store


results_app = typer.Typer(help="Stored load points: list them, show one.", no_args_is_help=True)
import_app = typer.Typer(help="Import SGLang / vLLM / GuideLLM / AIPerf / genai-perf / LLMPerf "
                         "benchmark results into the store.",
                         no_args_is_help=True)


@results_app.command("list")
def results_list(
    source: str = typer.Option(None, "--source", help="Only this source: bench, experiment, import:KIND (sglang, vllm, guidellm, aiperf, genai-perf, llmperf)."),
    limit: str = typer.Option("50", "--limit", help="At most this many rows (newest first)."),
    store: str = typer.Option(None, "--store", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """List stored load points, newest first."""
    from servelab.bench.config import parse_number
    from servelab.bench.report import list_table
    from servelab.cli.console import make_console
    from servelab.store import Store

    n = parse_number(limit, int, "--limit")
    if n is None or n < 1:
        raise UserError(f"--limit must be >= 1, got {limit}")
    with Store(_existing(store), readonly=True) as st:
        damage = st.damage
        rows = st.load_points(source=source, limit=n)
    if as_json:
        from servelab import jsonout

        return jsonout.emit("load_points", jsonout.load_points(rows))
    console = make_console()
    if damage:
        console.print(f"warning: {st.path} failed its integrity check ({damage}); it is read "
                      "but refused for writing", style="yellow")
    if not rows:
        if source:  # said 'none stored yet' while other sources had rows
            console.print(f"no load points with source {source!r}; sources are bench, "
                          "experiment, import:KIND (sglang, vllm, guidellm, aiperf, genai-perf, "
                          "llmperf)")
        else:
            console.print("no load points stored yet: run `servelab bench` or `servelab import`")
        return
    console.print(list_table(rows))


@results_app.command("show")
def results_show(
    lp_id: str = typer.Argument(..., metavar="ID", help="The id shown by `servelab results list`."),
    as_json: bool = typer.Option(False, "--json", help="Print the row (summary, provenance) as JSON."),
    requests: bool = typer.Option(False, "--requests", help="With --json: add the per-request records."),
    telemetry: bool = typer.Option(False, "--telemetry", help="With --json: add the series "
                                   "scraped and sampled over the load (null when none)."),
    store: str = typer.Option(None, "--store", help=STORE_HELP),
) -> None:
    """Show one stored load point: its summary table, or everything as JSON."""
    from servelab.bench.config import parse_number
    from servelab.bench.report import summary_table
    from servelab.cli.console import make_console
    from servelab.store import Store

    i = parse_number(lp_id, int, "ID")
    with Store(_existing(store), readonly=True) as st:
        row = st.load_point(i)
        recs = list(st.requests(row)) if requests else None
        series = st.telemetry(row) if telemetry else None
    if as_json:
        from servelab import jsonout

        doc = jsonout.load_point(row, recs)
        if telemetry:
            doc["telemetry"] = series
        return jsonout.emit("load_point", doc)
    c = make_console()
    c.print(summary_table(row.summary, title=f"#{row.id} {row.source} {row.label or ''} "
                                              f"{row.model or ''} {row.load_key}"))
    for k in ("peak_concurrency", "measured_concurrency", "slo_attainment"):
        if row.summary.get(k) is not None:
            c.print(f"{k.replace('_', ' ')}: {row.summary[k]:g}")
    prov = row.provenance
    if prov.get("import_kind"):  # not measured by us: say where it came from
        c.print(f"imported {prov.get('time_utc', '?')} from {prov.get('imported_from', '?')} "
                f"({prov['import_kind']} result dated {prov.get('original_date') or 'unknown'})")
        return
    c.print(f"measured {prov.get('time_utc', '?')} on {prov.get('host', '?')} by servelab "
            f"{prov.get('servelab_version', '?')} ({prov.get('git_sha') or 'no git sha'})")


def _import(kind: str, file: str, label: str | None, store: str | None, as_json: bool) -> None:
    from servelab.bench.importers import import_file
    from servelab.console import literal
    from servelab.store import Store

    with Store(store) as st:
        ids, before = import_file(st, kind, file, label=label)
    if as_json:
        from servelab import jsonout

        return jsonout.emit("import", {"kind": kind, "file": file, "load_point_ids": ids,
                                       "imported_before": before})
    where = literal(file)
    if before:
        typer.echo(f"{where} was imported before (same content) as ids "
                   f"{', '.join(map(str, ids))}; nothing new was stored")
        return
    typer.echo(f"imported {len(ids)} load point(s) from {where}: ids {', '.join(map(str, ids))}")


@import_app.command("sglang")
def import_sglang(
    file: str = typer.Argument(..., metavar="FILE.jsonl", help="`sglang.bench_serving --output-file` JSONL."),
    label: str = typer.Option(None, "--label", help="Name for the rows (default: the file name)."),
    store: str = typer.Option(None, "--store", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Import SGLang bench_serving results (one load point per line)."""
    _import("sglang", file, label, store, as_json)


@import_app.command("vllm")
def import_vllm(
    file: str = typer.Argument(..., metavar="FILE.json", help="`vllm bench serve --save-result` JSON."),
    label: str = typer.Option(None, "--label", help="Name for the rows (default: the file name)."),
    store: str = typer.Option(None, "--store", help=STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Import vLLM benchmark_serving results."""
    _import("vllm", file, label, store, as_json)


# the peers' files: kind -> (metavar, what the file is, the command's help)
_PEERS = {
    "guidellm": ("benchmarks.json", "`guidellm run --output kind=json` (GuideLLM 0.8).",
                 "Import GuideLLM results (one load point per benchmark)."),
    "aiperf": ("profile_export_aiperf.json", "AIPerf's profile export; profile_export.jsonl "
               "beside it adds the per-request records.", "Import AIPerf results."),
    "genai-perf": ("profile_export_genai_perf.json", "genai-perf's profile export.",
                   "Import genai-perf results."),
    "llmperf": ("NAME_summary.json", "LLMPerf's summary; NAME_individual_responses.json "
                "beside it adds the per-request records.", "Import LLMPerf results."),
}


def _peer_command(kind: str, metavar: str, what: str, doc: str) -> None:
    def command(
        file: str = typer.Argument(..., metavar=metavar, help=what),
        label: str = typer.Option(None, "--label", help="Name for the rows (default: the file name)."),
        store: str = typer.Option(None, "--store", help=STORE_HELP),
        as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    ) -> None:
        _import(kind, file, label, store, as_json)

    command.__doc__ = doc
    import_app.command(kind)(command)


for _kind, (_metavar, _what, _doc) in _PEERS.items():
    _peer_command(_kind, _metavar, _what, _doc)


def register(app: typer.Typer) -> None:
    """Add `results` and `import` to the app."""
    app.add_typer(results_app, name="results")
    app.add_typer(import_app, name="import")
