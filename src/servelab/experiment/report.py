"""`servelab report NAME`: markdown and ONE self-contained HTML file (plots inline as base64 PNG):
the attribution table, plots, warnings, the provenance of every run, and a decision record."""

from __future__ import annotations

import base64
import dataclasses
import html
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab import atomic, paths
from servelab.errors import UserError
from servelab.experiment import evidence, plots, report_html, tradeoff
from servelab.experiment.noise_notes import interference_cells, stopping_lines
from servelab.experiment.stats import METRICS, Analysis, headline
from servelab.store import LoadPointRow, RunRow, Store

EFFECT_METRICS = ("output_throughput_tok_s", "ttft_ms", "tpot_ms")


@dataclass
class ExperimentData:
    name: str
    spec: dict[str, Any]
    runs: list[RunRow]
    load_points: dict[int, LoadPointRow]
    analysis: Analysis
    flagged: dict[int, str] = dataclasses.field(default_factory=dict)  # block -> interference reason
    excluded: list[int] = dataclasses.field(default_factory=list)  # blocks repeated, left out of statistics
    blocks_used: int = 0

    @property
    def primary(self) -> str:
        return self.spec.get("primary_metric", "output_throughput_tok_s")


def collect(store: Store, name: str, noise_band: float | None = None) -> ExperimentData:
    """Everything stored about an experiment, with its statistics (evidence.gather: the same
    runs and rule the runner decided with)."""
    ev = evidence.gather(store, name, noise_band)
    spec, runs, lps, an = ev.spec, ev.runs, ev.load_points, ev.analysis
    ok = [r for r in runs if r.status == "ok" and r.load_point_id in lps]
    baseline = an.baseline
    an.warnings += aa_notes(
        spec, an, baseline, data_metric=spec.get("primary_metric", "output_throughput_tok_s")
    )
    an.warnings += mixed_provenance([lps[r.load_point_id].provenance for r in ok])
    gone = [r for r in ok if (f := store.requests_file(lps[r.load_point_id])) and not f.exists()]
    if gone:
        an.warnings.append(
            f"the per-request records of {len(gone)} of {len(ok)} runs are missing (files under "
            f"{store.path.parent / 'results-requests'} moved or deleted): the TTFT/TPOT "
            f"distribution plots leave them out; every table and effect uses the stored summaries"
        )
    return ExperimentData(name, spec, runs, lps, an, ev.flagged, ev.excluded, ev.blocks_used)


def mixed_provenance(provs: list[dict[str, Any]]) -> list[str]:
    """Runs measured on different hosts, GPUs or servelab versions (e.g. a resume elsewhere)
    should not be pooled: say so."""
    out = []
    for key, label in (
        ("host", "hosts"),
        ("gpus", "GPU sets"),
        ("servelab_version", "servelab versions"),
    ):
        seen = {repr(p.get(key)) for p in provs}
        if len(seen) > 1:
            out.append(
                f"runs were measured on {len(seen)} different {label} ({', '.join(sorted(seen))}): "
                "results from different machines or software should not be pooled"
            )
    return out


def aa_notes(spec: dict[str, Any], an: Analysis, baseline: str, data_metric: str) -> list[str]:
    """An arm identical to the baseline (no recipe, flags, removals or env) is an A/A arm: its
    'effect' is the machine's own noise, which sizes the noise band."""
    out = []
    for arm, a in spec["arms"].items():
        if arm == baseline or a.get("recipe") or a.get("flags") or a.get("remove") or a.get("env"):
            continue
        for lk in an.load_keys:
            e = an.effects.get((arm, lk, data_metric))
            if e is not None and math.isfinite(e.ci_low):
                half = max(abs(e.pct(e.ci_low)), abs(e.pct(e.ci_high)))
                out.append(
                    f"A/A arm {arm} (identical to {baseline}) at {lk}: {e.text()}; this is the "
                    f"machine's own noise, a noise band of about +-{half:.1f}% fits it"
                )
    return out


def _num(x: float, digits: int = 4) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


def attribution_rows(data: ExperimentData) -> list[list[str]]:
    """Header + one row per arm x load point: medians, the effect with CI and verdict."""
    an, pm = data.analysis, data.primary
    head = [
        "arm",
        "load",
        "runs",
        f"{METRICS[pm].label} ({METRICS[pm].unit})",
        "vs baseline [95% CI]",
        "verdict",
        "TTFT change",
        "TPOT change",
        "accept len",
    ]
    rows = [head]
    for arm in an.arms:
        for lk in an.load_keys:
            s = an.spreads[(arm, lk, pm)]
            acc = an.spreads[(arm, lk, "accept_length")].median
            if arm == an.baseline:
                eff, verdict, ttft, tpot = "(baseline)", "", "", ""
            else:
                e = an.effects[(arm, lk, pm)]
                eff, verdict = e.text(), e.verdict
                et, ep = an.effects[(arm, lk, "ttft_ms")], an.effects[(arm, lk, "tpot_ms")]
                ttft = f"{et.text()} {et.verdict}"
                tpot = f"{ep.text()} {ep.verdict}"
            spread = (
                f"{_num(s.median)} (CV {s.cv * 100:.1f}%)"
                if math.isfinite(s.cv)
                else _num(s.median)
            )
            rows.append([arm, lk, str(s.n), spread, eff, verdict, ttft, tpot, _num(acc, 3)])
    return rows


def spread_rows(data: ExperimentData) -> list[list[str]]:
    """Header + one row per arm x load point: every metric's median over runs with its spread
    (min-max over runs, CV), so latency and acceptance are visible per run, not only as effects."""
    an = data.analysis
    rows = [["arm", "load", "runs"] + [f"{m.label} ({m.unit})" for m in METRICS.values()]]
    for arm in an.arms:
        for lk in an.load_keys:
            cells = []
            for key in METRICS:
                s = an.spreads[(arm, lk, key)]
                if s.n == 0:
                    cells.append("n/a")
                elif s.n == 1:
                    cells.append(_num(s.median))
                else:
                    cv = f", CV {s.cv * 100:.1f}%" if math.isfinite(s.cv) else ""
                    cells.append(f"{_num(s.median)} [{_num(s.min)}-{_num(s.max)}{cv}]")
            n = an.spreads[(arm, lk, data.primary)].n
            rows.append([arm, lk, str(n), *cells])
    return rows


def _md_table(rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows[1:]]
    return "\n".join(out)


# (key in a _provenance_rows row, column heading): the run columns both renderers show
_PROV_COLUMNS = (
    ("seq", "seq"),
    ("arm", "arm"),
    ("load", "load"),
    ("rep", "rep"),
    ("block", "block"),
    ("status", "status"),
    ("started", "started (UTC)"),
    ("duration_s", "s"),
    ("git", "git"),
    ("host", "host"),
    ("other_cpu", "other CPU (cores)"),
    ("steal", "steal"),
    ("load1", "load 1 min"),
    ("cores", "cores (client / engine)"),
    ("flagged", "interference"),
)

def _provenance_rows(data: ExperimentData) -> list[dict[str, Any]]:
    out = []
    for r in data.runs:
        lp = data.load_points.get(r.load_point_id) if r.load_point_id else None
        prov = lp.provenance if lp else {}
        procs = prov.get("processes") or []
        out.append(
            {
                "seq": r.seq,
                "arm": r.arm,
                "load": r.load_key,
                "rep": r.repetition + 1,
                "block": r.block,
                "status": r.status,
                "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.started))
                if r.started
                else "",
                "duration_s": f"{r.finished - r.started:.1f}" if r.started and r.finished else "",
                "git": prov.get("git_sha") or "",
                "host": prov.get("host") or "",
                "gpus": ", ".join(g.get("name", "") for g in prov.get("gpus") or []) or "none",
                "command": " ; ".join(" ".join(map(str, p.get("argv", []))) for p in procs),
                "server_info": prov.get("server_info"),
                "error": r.error or "",
                "log_tail": r.log_tail or "",
                "load_point_id": r.load_point_id,
                **interference_cells(prov, r.block, data.excluded),
            }
        )
    return out


def _decision(data: ExperimentData) -> tuple[str, list[str]]:
    return data.spec.get("hypothesis") or "(none given)", headline(data.analysis, data.primary)


def markdown(data: ExperimentData) -> str:
    """The report as markdown (tables and text; the plots are in the HTML)."""
    hyp, result = _decision(data)
    spec = data.spec
    lines = [
        f"# Experiment {data.name}",
        "",
        f"engine `{spec['engine']}`, model `{spec.get('model') or '-'}`, order {spec['order']}, "
        f"noise band +-{data.analysis.noise_band * 100:g}%, "
        f"{sum(r.status == 'ok' for r in data.runs)} ok / {len(data.runs)} stored runs",
        "",
        "## Attribution",
        "",
        _md_table(attribution_rows(data)),
        "",
        "## Medians over runs [min-max, CV]",
        "",
        _md_table(spread_rows(data)),
        "",
    ]
    per, cap_effects, suggested = report_html.sections(data)
    if per:
        lines += ["## Capacity under SLOs", "", _md_table(report_html.capacity_rows(per, cap_effects)),
                  ""] + [f"- {e.sentence()}" for e in cap_effects] + [""]
    stops = stopping_lines(data)
    if stops:
        lines += ["## Stopping rule and interference", ""] + [f"- {x}" for x in stops] + [""]
    if data.analysis.warnings:
        lines += ["## Warnings", ""] + [f"- {w}" for w in data.analysis.warnings] + [""]
    lines += report_html.decision_markdown(
        hyp, result + [e.sentence() for e in cap_effects], suggested
    )
    lines += [
        "## Runs (provenance)",
        "",
        _md_table(
            [[head for _, head in _PROV_COLUMNS] + ["error"]]
            + [
                [str(p[k]) for k, _ in _PROV_COLUMNS] + [p["error"][:80]]
                for p in _provenance_rows(data)
            ]
        ),
        "",
    ]
    return "\n".join(lines)


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3} .better{color:#080;font-weight:bold} .worse{color:#b00;font-weight:bold}
.plots img{max-width:49%;border:1px solid #ddd;margin:2px} pre{white-space:pre-wrap;font-size:11px}
.warn{background:#fff6dd;padding:.5em 1em;border-left:4px solid #e0a800}
"""

_SCRIPT = """
window.addEventListener('load', function () {
  var imgs = document.querySelectorAll('img.plot'), ok = 0;
  imgs.forEach(function (i) { if (i.complete && i.naturalWidth > 0) ok++; });
  document.body.setAttribute('data-plots-loaded', ok + '/' + imgs.length);
});
"""


def _img(png: bytes, alt: str) -> str:
    return (
        f'<img class="plot" alt="{html.escape(alt)}" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}">'
    )


def _html_table(rows: list[list[str]], verdict_col: int | None = None) -> str:
    out = ["<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in rows[0]) + "</tr>"]
    for r in rows[1:]:
        cells = []
        for i, c in enumerate(r):
            cls = f' class="{c}"' if i == verdict_col and c in ("better", "worse") else ""
            cells.append(f"<td{cls}>{html.escape(c)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


def per_request(
    data: ExperimentData, store: Store, fields: tuple[str, ...]
) -> dict[str, dict[tuple[str, str], list[float]]]:
    """Per-request values of each of `fields` pooled over the ok runs of each arm x load point
    (one read of the stored requests for all fields)."""
    out: dict[str, dict[tuple[str, str], list[float]]] = {f: {} for f in fields}
    for r in data.runs:
        lp = data.load_points.get(r.load_point_id) if r.load_point_id else None
        if r.status != "ok" or lp is None:
            continue
        vals = {f: out[f].setdefault((r.arm, r.load_key), []) for f in fields}
        f_req = store.requests_file(lp)
        if f_req is not None and not f_req.exists():
            continue                            # said among the warnings (collect)
        got: dict[str, list[float]] = {f: [] for f in fields}
        try:
            for rec in store.requests(lp):
                for f in fields:
                    v = rec.get(f)
                    if isinstance(v, int | float) and math.isfinite(v):
                        got[f].append(float(v))
        except UserError as exc:                # a damaged file: left out, and said
            data.analysis.warnings.append(f"{exc}: the distribution plots leave that run out")
            continue
        for f in fields:
            vals[f] += got[f]
    return out


def render_html(data: ExperimentData, store: Store) -> str:
    """The self-contained HTML report."""
    an, hyp_result = data.analysis, _decision(data)
    imgs = [_img(plots.throughput(an, data.primary), "throughput vs load")]
    dists = {"ttft_ms": "TTFT (ms)", "tpot_ms": "TPOT (ms)"}
    pooled = per_request(data, store, tuple(dists))
    for field, label in dists.items():
        imgs.append(
            _img(
                plots.distributions(pooled[field], an.arms, an.load_keys, label),
                f"{field} distribution",
            )
        )
    acc = plots.acceptance(an)
    if acc is not None:
        imgs.append(_img(acc, "acceptance length"))
    imgs.append(_img(plots.effects(an, EFFECT_METRICS), "effects with CIs"))
    spec = data.spec
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>servelab: {html.escape(data.name)}"
        f"</title><style>{_CSS}</style></head><body>",
        f"<h1>Experiment {html.escape(data.name)}</h1>",
        f"<p>engine <code>{html.escape(spec['engine'])}</code>, model "
        f"<code>{html.escape(spec.get('model') or '-')}</code>, "
        f"order {html.escape(spec['order'])}, "
        f"noise band &plusmn;{an.noise_band * 100:g}%, generated "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}</p>",
        "<h2>Attribution</h2>",
        _html_table(attribution_rows(data), verdict_col=5),
        "<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in hyp_result[1]) + "</ul>",
    ]
    per, cap_effects, suggested = report_html.sections(data)
    if per:
        parts += [
            "<h2>Capacity under SLOs</h2><div class='capacity'>",
            _html_table(report_html.capacity_rows(per, cap_effects), verdict_col=4),
            "<ul>" + "".join(f"<li>{html.escape(e.sentence())}</li>" for e in cap_effects),
            "</ul></div>",
        ]
    trade = tradeoff.collect(store, spec, data.runs, data.load_points, an.arms)
    parts += ["<h2>Latency against throughput</h2>", report_html.tradeoff_html(trade.to_json())]
    stops = stopping_lines(data)
    if stops:
        parts.append(
            "<h2>Stopping rule and interference</h2><ul>"
            + "".join(f"<li>{html.escape(x)}</li>" for x in stops)
            + "</ul>"
        )
    if an.warnings:
        parts.append(
            "<div class='warn'><b>Warnings</b><ul>"
            + "".join(f"<li>{html.escape(w)}</li>" for w in an.warnings)
            + "</ul></div>"
        )
    parts += [
        "<h2>Medians over runs [min-max, CV]</h2>",
        _html_table(spread_rows(data)),
        "<h2>Plots</h2><div class='plots'>",
        *imgs,
        "</div>",
        "<h2>Decision record</h2>",
        report_html.decision_html(
            hyp_result[0], hyp_result[1] + [e.sentence() for e in cap_effects], suggested
        ),
        "<h2>Experiment settings (as stored)</h2>",
        report_html.kv_table(spec),
        "<h2>Runs and their provenance</h2><table><tr>"
        + "".join(
            f"<th>{h}</th>"
            for h in [head for _, head in _PROV_COLUMNS] + ["GPUs", "command, server info, log"]
        )
        + "</tr>",
    ]
    for p in _provenance_rows(data):
        detail = (
            f"<details><summary>details</summary><pre>{html.escape(p['command'])}</pre>"
            + report_html.kv_table(p["server_info"] or {})
            + (
                f"<pre>{html.escape(p['error'])}\n{html.escape(p['log_tail'])}</pre>"
                if p["error"] or p["log_tail"]
                else ""
            )
            + "</details>"
        )
        parts.append(
            "<tr>"
            + "".join(
                f"<td>{html.escape(str(p[k]))}</td>"
                for k in [k for k, _ in _PROV_COLUMNS] + ["gpus"]
            )
            + f"<td>{detail}</td></tr>"
        )
    parts += ["</table>", f"<script>{_SCRIPT}</script></body></html>"]
    return "\n".join(parts)


def write(
    store: Store, name: str, out_dir: Path | None = None, noise_band: float | None = None
) -> tuple[Path, Path, ExperimentData]:
    """Write report.md and report.html; returns their paths and the data. `noise_band`
    overrides the experiment file's band for the verdicts (e.g. one an A/A arm measured)."""
    data = collect(store, name, noise_band)
    out = Path(out_dir) if out_dir else paths.home() / "reports" / name
    md, page = out / "report.md", out / "report.html"
    page_html = render_html(data, store)      # first: reading the request files may add warnings
    atomic.write_text(md, markdown(data))
    atomic.write_text(page, page_html)
    return md, page, data
