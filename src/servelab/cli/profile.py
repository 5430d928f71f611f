"""CLI verbs: `servelab profile TRACE ...`, `servelab profile capture ...`, `servelab ceiling ...`.

Thin: parse options, call servelab.profile.*, print tables. `profile` is a group whose default
command analyses a trace, so `servelab profile TRACE` and `servelab profile capture --url URL`
both read as documented.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import typer
from typer.core import TyperGroup

from servelab.console import literal
from servelab.errors import UserError


class _DefaultToAnalyze(TyperGroup):
    """`servelab profile X ...` runs `analyze X ...` unless X names a subcommand."""

    def parse_args(self, ctx, args):  # noqa: D401 - click hook
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["analyze", *args]
        return super().parse_args(ctx, args)


def _fmt(x: float | None, nd: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{nd}f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _print_report(r: dict, vs: dict | None, top: int) -> None:
    from rich.table import Table

    from servelab.cli.console import make_console

    con = make_console()  # pipes: wide, so rows stay on one line
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


def _write_outputs(report: dict, vs: dict | None, json_out: str | None, html_out: str | None) -> None:
    from servelab import atomic
    from servelab.profile.analyze import public
    from servelab.profile.html import profile_html

    doc = public(report)
    if vs is not None:
        doc["vs"] = vs
    if json_out == "-":  # stdout
        from servelab import jsonout

        typer.echo(jsonout.dumps(jsonout.document("profile", doc)))
    elif json_out:
        atomic.write_text(json_out, json.dumps(doc, indent=1, default=str))
        typer.echo(f"wrote {literal(json_out)}")
    if html_out:
        atomic.write_text(html_out, profile_html(doc, vs))
        typer.echo(f"wrote {literal(html_out)}")


def _analyze_and_print(trace, step_regex, rules, what_if, vs, json_out, html_out, top) -> None:
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
    if json_out != "-":  # `--json -`: stdout holds the document only
        _print_report(report, diff, top)
    _write_outputs(report, diff, json_out, html_out)


def register(app: typer.Typer) -> None:
    """Add `profile` (analyze, capture) and `ceiling` to the app."""
    prof = typer.Typer(
        cls=_DefaultToAnalyze,
        help="Where GPU time goes in a PyTorch/Kineto trace: steps, idle, categories, what-if.",
        no_args_is_help=True,
    )

    @prof.command("analyze")
    def analyze_cmd(
        trace: str = typer.Argument(..., help="Kineto/Chrome trace, .json or .json.gz."),
        step_regex: str = typer.Option(None, "--step-regex", help="Annotation names that mark steps."),
        rules: str = typer.Option(None, "--rules", help="TOML of category rules tried before the built-in ones."),
        what_if: list[str] = typer.Option(None, "--what-if", help="CATEGORY=free, CATEGORY=2x, kernel:REGEX=free; repeatable."),
        vs: str = typer.Option(None, "--vs", help="A second trace to diff against (B vs this A)."),
        json_out: str = typer.Option(None, "--json", help="Write the report as JSON to FILE (- : stdout)."),
        html_out: str = typer.Option(None, "--html", help="Write a self-contained HTML page."),
        top: int = typer.Option(15, "--top", help="Kernels to list."),
    ) -> None:
        """Analyse TRACE (also: `servelab profile TRACE ...`)."""
        if top < 1:
            raise UserError(f"--top must be >= 1, got {top}")
        _check_outputs(json_out, html_out)
        _analyze_and_print(trace, step_regex, rules, what_if, vs, json_out, html_out, top)

    @prof.command("capture")
    def capture_cmd(
        url: str = typer.Option(..., "--url", help="Server root with /start_profile, e.g. http://127.0.0.1:30000."),
        num_steps: int = typer.Option(40, "--num-steps", help="Forward steps to profile."),
        out: str = typer.Option("profiles", "--out", help="Directory for the trace (on the server's host)."),
        load: int = typer.Option(4, "--load", help="Completions kept in flight while profiling (0: none)."),
        max_tokens: int = typer.Option(64, "--max-tokens", help="Tokens per load request."),
        model: str = typer.Option(None, "--model", help="Model name for the load requests."),
        timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for the trace files."),
        json_out: str = typer.Option(None, "--json", help="Also write the analysis as JSON to FILE (- : stdout)."),
        html_out: str = typer.Option(None, "--html", help="Also write the analysis as HTML."),
    ) -> None:
        """Ask a server for a trace of --num-steps forward steps, then analyse it."""
        from servelab.profile.capture import CaptureConfig, capture

        _check_outputs(json_out, html_out)
        files = capture(CaptureConfig(url, num_steps, Path(out), load, max_tokens, model, timeout))
        for f in files:
            typer.echo(f"trace: {literal(f)}", err=json_out == "-")
        _analyze_and_print(str(files[0]), None, None, None, None, json_out, html_out, 15)

    app.add_typer(prof, name="profile")

    @app.command("ceiling")
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
        json_out: str = typer.Option(None, "--json", help="Write the bounds as JSON to FILE (- : stdout)."),
    ) -> None:
        """Roofline tokens/s ceiling of decode for a model on GPUs, per batch size."""
        from servelab.profile.ceiling_report import ceiling_report, print_ceiling

        _check_outputs(json_out)

        try:
            batches = [int(x) for x in batch.split(",") if x.strip()]
        except ValueError:
            raise UserError(f"--batch {batch!r}: write integers separated by commas, e.g. 1,8,16") from None
        doc = ceiling_report(model, gpu, batches, context, tp, weight_dtype, expert_dtype, kv_dtype,
                             mtp_accept, mtp_draft, measured, measured_peaks, allreduce_latency_us)
        if json_out == "-":  # stdout holds the document only
            from servelab import jsonout

            return typer.echo(jsonout.dumps(jsonout.document("ceiling", doc)))
        print_ceiling(doc)
        if json_out:
            from servelab import atomic

            atomic.write_text(json_out, json.dumps(doc, indent=1, default=str))
            typer.echo(f"wrote {literal(json_out)}")
