"""CLI verbs: `servelab profile TRACE ...`, `servelab profile capture ...`, `servelab ceiling ...`.

Thin: parse options, call servelab.profile.*, print tables. `profile` is a group whose default
command analyses a trace, so `servelab profile TRACE` and `servelab profile capture --url URL`
both read as documented. Outputs follow the other verbs (docs/JSON.md): `--json` prints the
document on stdout (the tables then go to stderr), `--output-file FILE` writes the same document
to a file, `--html FILE` a page.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from pathlib import Path

import typer
from typer.core import TyperCommand, TyperGroup

try:  # recent Typer releases vendor click; older ones use the click package (as cli/__init__)
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover - depends on the Typer version installed
    from click import exceptions as _click_exc

from servelab.console import literal
from servelab.errors import UserError


class _DefaultToAnalyze(TyperGroup):
    """`servelab profile X ...` runs `analyze X ...` unless X names a subcommand."""

    def parse_args(self, ctx, args):  # noqa: D401 - click hook
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["analyze", *args]
        return super().parse_args(ctx, args)


class _JsonFlagCommand(TyperCommand):
    """`--json` is a flag (stdout), as on every verb; `--json FILE` / `--json -`, the spelling
    these verbs had before, fails as an extra argument: say what replaced it."""

    def parse_args(self, ctx, args):  # noqa: D401 - click hook
        given = list(args)  # the parser consumes `args`
        try:
            return super().parse_args(ctx, args)
        except _click_exc.UsageError as exc:
            if "--json" in given and "unexpected extra argument" in exc.message:
                raise _click_exc.UsageError(
                    f"{exc.message}; --json takes no value: it prints the document on stdout "
                    "(write a file with --output-file FILE)", ctx) from None
            raise


def _fmt(x: float | None, nd: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{nd}f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _print_report(r: dict, vs: dict | None, top: int, err: bool = False) -> None:
    from rich.table import Table

    from servelab.cli.console import make_console

    con = make_console(stderr=err)  # pipes: wide, so rows stay on one line
    con.print(r["verdict"], style="bold")
    n = max(r["n_steps"], 1)
    g = r["cuda_graphs"]
    con.print(
        f"{r['n_steps']} steps ({r['steps_from']}); mean step {_fmt(r['wall_us'] / n)} us, "
        f"GPU busy {_pct(r['gpu_busy_fraction'])}, idle {_pct(r['idle_fraction'])}; "
        f"kernel time {_fmt(r['kernel_total_us'] / n)} us/step; CUDA graphs: "
        f"{g['graph_launches']} launches holding {g['kernels_in_graphs']} kernels"
        + (f" ({_fmt(g['mean_launch_busy_us'])} us busy of {_fmt(g['mean_launch_span_us'])} us "
           "per replay)" if g["graph_launches"] else "")
    )
    if r["outside_steps"]["n_activities"]:
        con.print(
            f"{r['outside_steps']['n_activities']} GPU activities "
            f"({_fmt(r['outside_steps']['time_us'])} us) were launched outside every step "
            "and are not counted", style="dim"
        )
    if r["n_steps"] > 12:
        walls = sorted(s["wall_us"] for s in r["steps"])
        idles = sorted(s["idle_fraction"] or 0.0 for s in r["steps"])
        con.print(
            f"step wall us: median {_fmt(walls[len(walls) // 2])} (min {_fmt(walls[0])}, max "
            f"{_fmt(walls[-1])}); idle: median {_pct(idles[len(idles) // 2])} (min "
            f"{_pct(idles[0])}, max {_pct(idles[-1])})"
        )
    else:
        t = Table(title="steps")
        for c in ("step", "name", "wall us", "busy us", "idle", "kernels", "graphs"):
            t.add_column(c, justify="right" if c != "name" else "left", no_wrap=True,
                         overflow="ellipsis", max_width=24 if c == "name" else None)
        for s in r["steps"]:
            t.add_row(str(s["index"]), s["name"][:40], _fmt(s["wall_us"]), _fmt(s["gpu_busy_us"]),
                      _pct(s["idle_fraction"]), str(s["n_activities"]), str(s["n_graph_launches"]))
        con.print(t)
    t = Table(title="categories (ranked by the most each could give if free)")
    for c in ("category", "us/step", "share", "count", "only-it us/step", "if free"):
        t.add_column(c, justify="left" if c == "category" else "right")
    cats = {c["category"]: c for c in r["categories"]}
    for row in r["ranking"]:
        c = cats[row["category"]]
        t.add_row(c["category"], _fmt(c["per_step_us"]), _pct(c["share"]), str(c["count"]),
                  _fmt(c["exclusive_us"] / n), f"{_fmt(c['max_speedup_if_free'], 2)}x")
    con.print(t)
    t = Table(title=f"top {top} kernels")
    t.add_column("kernel", no_wrap=True, overflow="ellipsis", max_width=48)
    for c in ("category", "count", "total us", "mean us", "share"):
        t.add_column(c, justify="left" if c == "category" else "right", no_wrap=True)
    for k in r["top_kernels"][:top]:
        t.add_row(k["short"], k["category"], str(k["count"]), _fmt(k["total_us"]),
                  _fmt(k["mean_us"], 2), _pct(k["share"]))
    con.print(t)
    if r.get("what_if"):
        w = r["what_if"]
        con.print(
            f"what-if {', '.join(w['specs'])}: step {_fmt(w['per_step_us'])} us -> "
            f"{_fmt(w['new_per_step_us'])} us, speedup {_fmt(w['speedup'], 3)}x ({w['note']})"
        )
    if vs:
        t = Table(title=f"A vs B per step: step {_fmt(vs['a_step_us'])} -> {_fmt(vs['b_step_us'])} us")
        for c in ("category", "A us", "B us", "delta us", "B/A"):
            t.add_column(c, justify="left" if c == "category" else "right")
        for x in vs["categories"]:
            t.add_row(x["key"], _fmt(x["a_per_step_us"]), _fmt(x["b_per_step_us"]),
                      _fmt(x["delta_us"]), _fmt(x["ratio"], 3))
        con.print(t)
        t = Table(title="A vs B per step: top kernels")
        t.add_column("kernel", no_wrap=True, overflow="ellipsis", max_width=48)
        for c in ("A us", "B us", "delta us", "B/A"):
            t.add_column(c, justify="right")
        for x in vs["kernels"][:top]:
            t.add_row(x["short"], _fmt(x["a_per_step_us"]), _fmt(x["b_per_step_us"]),
                      _fmt(x["delta_us"]), _fmt(x["ratio"], 3))
        con.print(t)


def _check_outputs(*outs: str | None) -> None:
    """Refuse an output path that cannot be written before the work, not after it."""
    for out in outs:
        if not out:
            continue
        p = Path(out)
        if p.is_dir():
            raise UserError(f"{out} is a folder; give a file name, e.g. {p / 'profile.json'}")
        if not p.parent.is_dir():
            raise UserError(f"{out}: its folder {p.parent} does not exist")
        if not os.access(p.parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
            raise UserError(f"{out}: cannot write there; give a path you can write")


def _write_document(kind: str, doc: dict, as_json: bool, output_file: str | None) -> None:
    """The `--json` document on stdout and/or in `--output-file` (the same document)."""
    from servelab import atomic, jsonout

    text = jsonout.dumps(jsonout.document(kind, doc))
    if output_file:
        atomic.write_text(output_file, text + "\n")
        typer.echo(f"wrote {literal(output_file)}", err=as_json)
    if as_json:
        typer.echo(text)


def _write_outputs(report: dict, vs: dict | None, as_json: bool, output_file: str | None,
                   html_out: str | None) -> None:
    from servelab import atomic
    from servelab.profile.analyze import public
    from servelab.profile.html import profile_html

    doc = public(report)
    if vs is not None:
        doc["vs"] = vs
    if html_out:
        atomic.write_text(html_out, profile_html(doc, vs))
        typer.echo(f"wrote {literal(html_out)}", err=as_json)
    _write_document("profile", doc, as_json, output_file)


def _analyze_and_print(trace, step_regex, rules, what_if, vs, as_json, output_file, html_out,
                       top) -> None:
    from servelab import provenance
    from servelab.profile.analyze import analyze, compare
    from servelab.profile.breakdown import load_rules

    ruleset = load_rules(rules)
    report = analyze(trace, step_regex=step_regex, rules=ruleset, whatifs=what_if or None)
    report["provenance"] = provenance.collect(tool="servelab profile")
    diff = None
    if vs:
        other = analyze(vs, step_regex=step_regex, rules=ruleset)
        diff = compare(report, other)
    _print_report(report, diff, top, err=as_json)  # with --json, stdout holds the document only
    _write_outputs(report, diff, as_json, output_file, html_out)


_JSON_HELP = ("Print the result as one JSON document on stdout (docs/JSON.md); the tables go "
              "to stderr.")
_FILE_HELP = "Also write that JSON document to FILE."


def register(app: typer.Typer) -> None:
    """Add `profile` (analyze, capture) and `ceiling` to the app."""
    prof = typer.Typer(
        cls=_DefaultToAnalyze,
        help="Where GPU time goes in a PyTorch/Kineto trace: steps, idle, categories, what-if.",
        no_args_is_help=True,
    )

    @prof.command("analyze", cls=_JsonFlagCommand)
    def analyze_cmd(
        trace: str = typer.Argument(..., help="Kineto/Chrome trace, .json or .json.gz."),
        step_regex: str = typer.Option(None, "--step-regex", help="Annotation names that mark steps."),
        rules: str = typer.Option(None, "--rules", help="TOML of category rules tried before the built-in ones."),
        what_if: list[str] = typer.Option(None, "--what-if", help="CATEGORY=free, CATEGORY=2x, kernel:REGEX=free; repeatable."),
        vs: str = typer.Option(None, "--vs", help="A second trace to diff against (B vs this A)."),
        as_json: bool = typer.Option(False, "--json", help=_JSON_HELP),
        output_file: str = typer.Option(None, "--output-file", help=_FILE_HELP),
        html_out: str = typer.Option(None, "--html", help="Write a self-contained HTML page."),
        top: int = typer.Option(15, "--top", help="Kernels to list."),
    ) -> None:
        """Analyse TRACE (also: `servelab profile TRACE ...`)."""
        if top < 1:
            raise UserError(f"--top must be >= 1, got {top}")
        _check_outputs(output_file, html_out)
        _analyze_and_print(trace, step_regex, rules, what_if, vs, as_json, output_file, html_out,
                           top)

    @prof.command("capture", cls=_JsonFlagCommand)
    def capture_cmd(
        url: str = typer.Option(..., "--url", help="Server root with /start_profile, e.g. http://127.0.0.1:30000."),
        num_steps: int = typer.Option(40, "--num-steps", help="Forward steps to profile."),
        out: str = typer.Option("profiles", "--out", help="Directory for the trace (on the server's host)."),
        load: int = typer.Option(4, "--load", help="Completions kept in flight while profiling (0: none)."),
        max_tokens: int = typer.Option(64, "--max-tokens", help="Tokens per load request."),
        model: str = typer.Option(None, "--model", help="Model name for the load requests."),
        timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for the trace files."),
        as_json: bool = typer.Option(False, "--json", help=_JSON_HELP),
        output_file: str = typer.Option(None, "--output-file", help=_FILE_HELP),
        html_out: str = typer.Option(None, "--html", help="Also write the analysis as HTML."),
    ) -> None:
        """Ask a server for a trace of --num-steps forward steps, then analyse it."""
        from servelab.profile.capture import CaptureConfig, capture

        _check_outputs(output_file, html_out)
        files = capture(CaptureConfig(url, num_steps, Path(out), load, max_tokens, model, timeout))
        for f in files:
            typer.echo(f"trace: {literal(f)}", err=as_json)
        _analyze_and_print(str(files[0]), None, None, None, None, as_json, output_file, html_out,
                           15)

    app.add_typer(prof, name="profile")

    @app.command("ceiling", cls=_JsonFlagCommand)
    def ceiling_cmd(
        model: str = typer.Option(..., "--model", help="Model preset or a Hugging Face config.json path."),
        gpu: str = typer.Option(..., "--gpu", help="GPU preset (h100, h200, b200, rtx-pro-6000 [Server Edition], rtx-pro-6000-ws)."),
        tp: int = typer.Option(1, "--tp", help="Tensor-parallel GPUs."),
        batch: str = typer.Option("1,8,16,64", "--batch", help="Batch sizes, comma separated."),
        context: int = typer.Option(4096, "--context", help="Tokens of context per request."),
        weight_dtype: str = typer.Option(None, "--weight-dtype", help="bf16 | fp8 | fp4 (default: the preset's)."),
        expert_dtype: str = typer.Option(None, "--expert-dtype", help="MoE expert weights dtype (default: weights')."),
        kv_dtype: str = typer.Option("bf16", "--kv-dtype", help="bf16 | fp8."),
        mtp_accept: float = typer.Option(None, "--mtp-accept", help="MTP acceptance length tau (tokens per verify step)."),
        mtp_draft: int = typer.Option(1, "--mtp-draft", help="Draft tokens per step."),
        measured: float = typer.Option(None, "--measured", help="Measured tok/s to compare with the bound."),
        measured_peaks: bool = typer.Option(False, "--measured-peaks", help="Use this lab's measured GPU peaks."),
        allreduce_latency_us: float = typer.Option(0.0, "--allreduce-latency-us", help="Fixed cost per TP all-reduce (e.g. NCCL small-message latency); 0 = bandwidth only."),
        as_json: bool = typer.Option(False, "--json", help=_JSON_HELP),
        output_file: str = typer.Option(None, "--output-file", help=_FILE_HELP),
    ) -> None:
        """Roofline tokens/s ceiling of decode for a model on GPUs, per batch size."""
        from servelab.profile.ceiling_report import ceiling_report, print_ceiling

        _check_outputs(output_file)

        try:
            batches = [int(x) for x in batch.split(",") if x.strip()]
        except ValueError:
            raise UserError(f"--batch {batch!r}: write integers separated by commas, e.g. 1,8,16") from None
        doc = ceiling_report(model, gpu, batches, context, tp, weight_dtype, expert_dtype, kv_dtype,
                             mtp_accept, mtp_draft, measured, measured_peaks, allreduce_latency_us)
        if as_json:  # stdout holds the document only; the table goes to stderr
            with contextlib.redirect_stdout(sys.stderr):
                print_ceiling(doc)
        else:
            print_ceiling(doc)
        _write_document("ceiling", doc, as_json, output_file)
