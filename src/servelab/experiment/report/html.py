"""`servelab report NAME`: ONE self-contained HTML file (plots inline as base64 PNG): the
attribution table, plots, warnings, the provenance of every run, and a decision record; and
`write`, which writes it beside the markdown (markdown.py)."""

from __future__ import annotations

import base64
import html
import time
from pathlib import Path

from servelab import atomic, paths
from servelab.experiment.report import plots, sections, timeseries, tradeoff
from servelab.experiment.report.data import collect, per_request
from servelab.experiment.report.markdown import markdown
from servelab.experiment.report.noise import stopping_lines
from servelab.experiment.report.tables import (
    PROV_COLUMNS,
    VERDICT,
    attribution_rows,
    decision,
    provenance_rows,
    spread_rows,
    turn_rows,
)
from servelab.experiment.stats.evidence import Evidence
from servelab.store import Store

EFFECT_METRICS = ("output_throughput_tok_s", "ttft_ms", "tpot_ms")

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
            word = c.split("  (", 1)[0]  # a verdict with its throttling note
            cls = f' class="{word}"' if i == verdict_col and word in ("better", "worse") else ""
            cells.append(f"<td{cls}>{html.escape(c)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


def render_html(data: Evidence, store: Store) -> str:
    """The self-contained HTML report."""
    an, hyp_result = data.analysis, decision(data)
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
    attrib = attribution_rows(data)
    series = timeseries.collect(data, store)
    an.warnings += [f"{m}: the time-series panel leaves that run out" for m in series.unreadable]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>servelab: {html.escape(data.name)}"
        f"</title><style>{_CSS}</style></head><body>",
        f"<h1>Experiment {html.escape(data.name)}</h1>",
        f"<p>engine <code>{html.escape(spec.engine)}</code>, model "
        f"<code>{html.escape(spec.model or '-')}</code>, "
        f"order {html.escape(spec.order)}, "
        f"noise band &plusmn;{an.noise_band * 100:g}%, generated "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}</p>",
        "<h2>Attribution</h2>",
        _html_table(attrib, verdict_col=attrib[0].index(VERDICT)),
        "<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in hyp_result[1]) + "</ul>",
    ]
    turns = turn_rows(data)
    if len(turns) > 1:
        parts += ["<h2>TTFT by turn index</h2>", _html_table(turns)]
    per, cap_effects, suggested = sections.sections(data)
    if per:
        parts += [
            "<h2>Capacity under SLOs</h2><div class='capacity'>",
            _html_table(sections.capacity_rows(per, cap_effects,
                                                 sections.capacity_throttle(data)), verdict_col=4),
            "<ul>" + "".join(f"<li>{html.escape(e.sentence())}</li>" for e in cap_effects),
            "</ul></div>",
        ]
    trade = tradeoff.collect(store, spec, data.runs, data.load_points, an.arms)
    parts += ["<h2>Latency against throughput</h2>", sections.tradeoff_html(trade.to_json()),
              "<h2>Over time, per run</h2>", sections.timeseries_html(series.to_json())]
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
        sections.decision_html(
            hyp_result[0], hyp_result[1] + [e.sentence() for e in cap_effects], suggested
        ),
        "<h2>Experiment settings (as stored)</h2>",
        sections.kv_table(data.stored),
        "<h2>Runs and their provenance</h2><table><tr>"
        + "".join(
            f"<th>{h}</th>"
            for h in [head for _, head in PROV_COLUMNS] + ["GPUs", "command, server info, log"]
        )
        + "</tr>",
    ]
    for p in provenance_rows(data):
        detail = (
            f"<details><summary>details</summary><pre>{html.escape(p['command'])}</pre>"
            + sections.kv_table(p["server_info"] or {})
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
                for k in [k for k, _ in PROV_COLUMNS] + ["gpus"]
            )
            + f"<td>{detail}</td></tr>"
        )
    parts += ["</table>", f"<script>{_SCRIPT}</script></body></html>"]
    return "\n".join(parts)


def write(
    store: Store, name: str, out_dir: Path | None = None, noise_band: float | None = None
) -> tuple[Path, Path, Evidence]:
    """Write report.md and report.html; returns their paths and the data. `noise_band`
    overrides the experiment file's band for the verdicts (e.g. one an A/A arm measured)."""
    data = collect(store, name, noise_band)
    out = Path(out_dir) if out_dir else paths.home() / "reports" / name
    md, page = out / "report.md", out / "report.html"
    page_html = render_html(data, store)      # first: reading the request files may add warnings
    atomic.write_text(md, markdown(data))
    atomic.write_text(page, page_html)
    return md, page, data
