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
from dataclasses import dataclass
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


def _cat_table(title: str, blk: dict):
    from rich.table import Table

    n = max(blk["n_steps"], 1)
    t = Table(title=title)
    for c in ("category", "us/step", "share", "count", "only-it us/step", "if free"):
        t.add_column(c, justify="left" if c == "category" else "right")
    cats = {c["category"]: c for c in blk["categories"]}
    for row in blk["ranking"]:
        c = cats[row["category"]]
        t.add_row(c["category"], _fmt(c["total_us"] / n), _pct(c["share"]), str(c["count"]),
                  _fmt(c["exclusive_us"] / n), f"{_fmt(c['max_speedup_if_free'], 2)}x")
    return t


def _kernel_table(title: str, kernels: list[dict], top: int):
    from rich.table import Table

    t = Table(title=title)
    t.add_column("kernel", no_wrap=True, overflow="ellipsis", max_width=48)
    for c in ("category", "count", "total us", "mean us", "share"):
        t.add_column(c, justify="left" if c == "category" else "right", no_wrap=True)
    for k in kernels[:top]:
        t.add_row(k["short"], k["category"], str(k["count"]), _fmt(k["total_us"]),
                  _fmt(k["mean_us"], 2), _pct(k["share"]))
    return t


def _phase_table(r: dict):
    from rich.table import Table

    t = Table(title="phases (steady state: warm-up steps excluded)")
    for c in ("phase", "role", "steps", "warm-up", "batch", "median us", "min-max us", "GPU busy",
              "bound", "largest category", "if free"):
        t.add_column(c, justify="left" if c in ("phase", "role", "bound", "largest category")
                     else "right", no_wrap=True)
    for name, p in r["phases"].items():
        top = p["categories"][0] if p["categories"] else None
        t.add_row(name + (" *" if name == r["focus_phase"] else ""), p["role"], str(p["n_steps"]),
                  str(p["n_warmup"]), "/".join(map(str, p["batch_sizes"])) or "-",
                  _fmt(p["median_step_us"]), f"{_fmt(p['min_step_us'])}-{_fmt(p['max_step_us'])}",
                  _pct(p["gpu_busy_fraction"]),
                  {True: "host", False: "GPU"}.get(p["host_bound"], "-"),
                  top["category"] if top else "-",
                  f"{_fmt(top['max_speedup_if_free'], 2)}x" if top else "-")
    return t


def _diff_tables(title: str, d: dict, top: int) -> list:
    from rich.table import Table

    t = Table(title=f"{title}: step {_fmt(d['a_step_us'])} -> {_fmt(d['b_step_us'])} us")
    for c in ("category", "A us", "B us", "delta us", "B/A"):
        t.add_column(c, justify="left" if c == "category" else "right")
    for x in d["categories"]:
        t.add_row(x["key"], _fmt(x["a_per_step_us"]), _fmt(x["b_per_step_us"]),
                  _fmt(x["delta_us"]), _fmt(x["ratio"], 3))
    k = Table(title=f"{title}: top kernels")
    k.add_column("kernel", no_wrap=True, overflow="ellipsis", max_width=48)
    for c in ("A us", "B us", "delta us", "B/A"):
        k.add_column(c, justify="right")
    for x in d["kernels"][:top]:
        k.add_row(x["short"], _fmt(x["a_per_step_us"]), _fmt(x["b_per_step_us"]),
                  _fmt(x["delta_us"]), _fmt(x["ratio"], 3))
    return [t, k]


def _print_what_ifs(con, r: dict) -> None:
    for name, p in r["phases"].items():
        if w := p.get("what_if"):
            con.print(f"what-if {', '.join(w['specs'])} on {name}: step "
                      f"{_fmt(w['per_step_us'])} us -> {_fmt(w['new_per_step_us'])} us, speedup "
                      f"{_fmt(w['speedup'], 3)}x ({w['note']})")
    if w := r.get("what_if"):
        con.print(f"what-if over all steady-state steps (secondary): speedup "
                  f"{_fmt(w['speedup'], 3)}x", style="dim")
    if m := r.get("mix_bound"):
        mix = ", ".join(f"{k} {100 * v:.0f}%" for k, v in m["phase_shares"].items())
        con.print(f"workload-weighted bound ({m['source']}: {mix}):", style="bold")
        if m["what_if"]:
            con.print(f"  what-if {', '.join(m['what_if']['specs'])}: "
                      f"{_fmt(m['what_if']['speedup'], 3)}x")
        for b in m["bounds"][:5]:
            per = ", ".join(f"{h} {_fmt(v, 2)}x" for h, v in b["per_phase"].items())
            con.print(f"  {b['category']} free: {_fmt(b['speedup_if_free'], 3)}x ({per})")
        for note in m["notes"]:
            con.print(f"  {note}", style="dim")


def _print_steps(con, r: dict) -> None:
    from rich.table import Table

    if r["n_steps"] > 12:
        walls = sorted(s["wall_us"] for s in r["steps"])
        idles = sorted(s["idle_fraction"] or 0.0 for s in r["steps"])
        con.print(
            f"step wall us: median {_fmt(walls[len(walls) // 2])} (min {_fmt(walls[0])}, max "
            f"{_fmt(walls[-1])}); idle: median {_pct(idles[len(idles) // 2])} (min "
            f"{_pct(idles[0])}, max {_pct(idles[-1])})"
        )
        return
    t = Table(title="steps")
    for c in ("step", "name", "wall us", "busy us", "idle", "kernels", "graphs", "warm-up"):
        t.add_column(c, justify="right" if c not in ("name", "warm-up") else "left",
                     no_wrap=True, overflow="ellipsis", max_width=24 if c == "name" else None)
    for s in r["steps"]:
        t.add_row(str(s["index"]), s["name"][:40], _fmt(s["wall_us"]), _fmt(s["gpu_busy_us"]),
                  _pct(s["idle_fraction"]), str(s["n_activities"]), str(s["n_graph_launches"]),
                  "yes" if s["warmup"] else "")
    con.print(t)


def _print_report(r: dict, vs: dict | None, top: int, err: bool = False) -> None:
    from servelab.cli.console import make_console

    con = make_console(stderr=err)  # pipes: wide, so rows stay on one line
    con.print(r["verdict"], style="bold")
    g = r["cuda_graphs"]
    con.print(
        f"{r['all_steps']}; {r['n_steps']} steps ({r['steps_from']}); CUDA graphs: "
        f"{g['graph_launches']} launches holding {g['kernels_in_graphs']} kernels"
        + (f" ({_fmt(g['mean_launch_busy_us'])} us busy of {_fmt(g['mean_launch_span_us'])} us "
           "per replay)" if g["graph_launches"] else ""), style="dim"
    )
    for w in r["warmup_steps"]:
        con.print(f"warm-up step {w['index']} {w['name']} ({_fmt(w['wall_us'])} us): "
                  f"{w['reason']}; excluded from the phase figures", style="yellow")
    if r["outside_steps"]["n_activities"]:
        con.print(
            f"{r['outside_steps']['n_activities']} GPU activities "
            f"({_fmt(r['outside_steps']['time_us'])} us) were launched outside every step "
            "and are not counted", style="dim"
        )
    _print_steps(con, r)
    con.print(_phase_table(r))
    for name, p in r["phases"].items():
        if p["n_steps"]:
            con.print(_cat_table(f"{name}: categories (ranked by the most each could give if "
                                 "free)", p))
    focus = r["phases"].get(r["focus_phase"] or "")
    if focus and focus["n_steps"]:
        con.print(_kernel_table(f"{r['focus_phase']}: top {top} kernels", focus["top_kernels"],
                                top))
    _print_what_ifs(con, r)
    if vs:
        for name, d in vs["phases"].items():
            for t in _diff_tables(f"A vs B, {name} per step", d, top):
                con.print(t)
        if not vs["phases"]:
            for t in _diff_tables("A vs B per step (all steps)", vs, top):
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


@dataclass(frozen=True, slots=True)
class AnalyzeConfig:
    """One `profile` analysis, as the flags gave it."""

    trace: str
    step_regex: str | None = None
    rules: str | None = None
    what_if: tuple[str, ...] = ()
    vs: str | None = None
    metric: str = "tpot"
    mix: str | None = None
    mix_from: int | None = None  # a stored load point's id
    top: int = 15
    store: str | None = None  # where --mix-from's load point is (None: the default store)

    def __post_init__(self) -> None:
        from servelab.profile.phases import METRICS

        if self.metric not in METRICS:
            raise UserError(f"--metric {self.metric!r}: choose one of {', '.join(METRICS)}")
        if self.top < 1:
            raise UserError(f"--top must be >= 1, got {self.top}")
        if self.mix and self.mix_from is not None:
            raise UserError("give --mix or --mix-from, not both")


def _mix(cfg: AnalyzeConfig) -> tuple[dict[str, float], str] | None:
    from servelab.profile.headline import mix_from_load_point
    from servelab.profile.phases import parse_mix

    if cfg.mix:
        return parse_mix(cfg.mix), f"--mix {cfg.mix}"
    if cfg.mix_from is None:
        return None
    from servelab.store import Store

    if cfg.store is not None and not Path(cfg.store).exists():  # opening would create it empty
        raise UserError(f"--store {cfg.store}: no results store there (leave --store out for "
                        "the default)")
    with Store(cfg.store, readonly=True) as st:
        lp = st.load_point(cfg.mix_from)
    return mix_from_load_point(lp.summary, lp.id), f"load point {lp.id} ({lp.load_key})"


def _analyze_and_print(cfg: AnalyzeConfig, as_json: bool, output_file: str | None,
                       html_out: str | None, extra: dict | None = None) -> None:
    from servelab import provenance
    from servelab.profile.analyze import analyze, compare
    from servelab.profile.breakdown import load_rules

    ruleset = load_rules(cfg.rules)
    trace, ranks = cfg.trace, None
    if Path(trace).is_dir():  # every rank's trace; the full report of the lowest rank
        from servelab.profile.ranks import analyze_ranks, rank_files

        ranks = analyze_ranks(trace, ruleset, cfg.step_regex)
        trace = str(rank_files(Path(trace))[0][1])
    report = analyze(trace, step_regex=cfg.step_regex, rules=ruleset,
                     whatifs=list(cfg.what_if) or None, metric=cfg.metric, mix=_mix(cfg))
    report["ranks"] = ranks
    report |= extra or {}
    report["provenance"] = provenance.collect(tool="servelab profile")
    diff = None
    if cfg.vs:
        other = analyze(cfg.vs, step_regex=cfg.step_regex, rules=ruleset, metric=cfg.metric)
        diff = compare(report, other)
    if ranks:
        from servelab.profile.ranks import print_ranks

        print_ranks(ranks, err=as_json)
    _print_report(report, diff, cfg.top, err=as_json)  # with --json, stdout: the document only
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
        trace: str = typer.Argument(..., help="Kineto/Chrome trace (.json, .json.gz), or a folder of per-rank ID-TP-RANK traces."),
        step_regex: str = typer.Option(None, "--step-regex", help="Annotation names that mark steps."),
        rules: str = typer.Option(None, "--rules", help="TOML of category rules tried before the built-in ones."),
        what_if: list[str] = typer.Option(None, "--what-if", help="CATEGORY=free, CATEGORY=2x, kernel:REGEX=free; repeatable."),
        vs: str = typer.Option(None, "--vs", help="A second trace to diff against (B vs this A), per phase."),
        metric: str = typer.Option("tpot", "--metric", help="The serving metric the headline speaks of: tpot (decode steps) or ttft (prefill steps)."),
        mix: str = typer.Option(None, "--mix", help="Shares of serving time per phase, e.g. decode=0.9,extend=0.1: the workload-weighted bound."),
        mix_from: int = typer.Option(None, "--mix-from", help="A stored load point's id: weigh prefill vs decode by its TTFT and (tokens - 1) x TPOT."),
        store: str = typer.Option(None, "--store", help="Results database of --mix-from (default: results.db in $SERVELAB_HOME, else ~/.servelab)."),
        as_json: bool = typer.Option(False, "--json", help=_JSON_HELP),
        output_file: str = typer.Option(None, "--output-file", help=_FILE_HELP),
        html_out: str = typer.Option(None, "--html", help="Write a self-contained HTML page."),
        top: int = typer.Option(15, "--top", help="Kernels to list."),
    ) -> None:
        """Analyse TRACE (also: `servelab profile TRACE ...`)."""
        cfg = AnalyzeConfig(trace, step_regex, rules, tuple(what_if or ()), vs, metric.lower(),
                            mix, mix_from, top, store)
        _check_outputs(output_file, html_out)
        _analyze_and_print(cfg, as_json, output_file, html_out)

    @prof.command("capture", cls=_JsonFlagCommand)
    def capture_cmd(
        url: str = typer.Option(..., "--url", help="Server root with /start_profile, e.g. http://127.0.0.1:30000."),
        num_steps: int = typer.Option(40, "--num-steps", help="Forward steps to profile."),
        out: str = typer.Option("profiles", "--out", help="Directory for the trace (on the server's host)."),
        load: int = typer.Option(4, "--load", help="Completions kept in flight while profiling (0: none): the decode batch."),
        max_tokens: int = typer.Option(64, "--max-tokens", help="Tokens per load request (--phase decode raises it so that no request ends inside the window)."),
        model: str = typer.Option(None, "--model", help="Model name for the load requests."),
        timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for steady state and the trace files."),
        phase: str = typer.Option("decode", "--phase", help="What the window holds: decode (steady decode at batch --load), extend (prefills), any."),
        include_warmup: bool = typer.Option(False, "--include-warmup", help="Start the profile before the load (warm-up steps included), as before."),
        warmup_steps: int = typer.Option(8, "--warmup-steps", help="Decode steps at the full batch before the profile starts."),
        as_json: bool = typer.Option(False, "--json", help=_JSON_HELP),
        output_file: str = typer.Option(None, "--output-file", help=_FILE_HELP),
        html_out: str = typer.Option(None, "--html", help="Also write the analysis as HTML."),
    ) -> None:
        """Ask a server for a trace of --num-steps steady-state steps, then analyse it."""
        from servelab.profile.capture import CaptureConfig, capture, window_makeup

        _check_outputs(output_file, html_out)
        cfg = CaptureConfig(url, num_steps, Path(out), load, max_tokens, model, timeout,
                            phase.lower(), include_warmup, warmup_steps)
        files, how = capture(cfg)
        for f in files:
            typer.echo(f"trace: {literal(f)}", err=as_json)
        makeup = window_makeup(files[0])
        parts = [f"{p['n_steps']} {name} (bs " + ", ".join(
            f"{b} x{n}" for b, n in sorted(p["batch_sizes"].items())) + ")"
            for name, p in makeup.items()]
        typer.echo(f"window: {'; '.join(parts) or 'no step annotations'} ({how})", err=as_json)
        _analyze_and_print(AnalyzeConfig(str(files[0])), as_json, output_file, html_out,
                           extra={"capture": {"window": makeup, "started": how,
                                              "request_tokens": cfg.request_tokens,
                                              "phase": cfg.phase,
                                              "include_warmup": cfg.include_warmup}})

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
