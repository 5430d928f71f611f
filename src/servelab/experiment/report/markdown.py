"""The report as markdown: the tables and text of the HTML report, without the plots."""

from __future__ import annotations

import re

from servelab.experiment.report import sections, timeseries
from servelab.experiment.report.noise import stopping_lines
from servelab.experiment.report.tables import (
    PROV_COLUMNS,
    attribution_rows,
    decision,
    provenance_rows,
    spread_rows,
    turn_rows,
)
from servelab.experiment.stats.evidence import Evidence


def md_table(rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows[1:]]
    return "\n".join(out)


def markdown(data: Evidence) -> str:
    """The report as markdown (tables and text; the plots are in the HTML)."""
    hyp, result = decision(data)
    spec = data.spec
    lines = [
        f"# Experiment {data.name}",
        "",
        f"engine `{spec.engine}`, model `{spec.model or '-'}`, order {spec.order}, "
        f"noise band +-{data.analysis.noise_band * 100:g}%, "
        f"{sum(r.status == 'ok' for r in data.runs)} ok / {len(data.runs)} stored runs",
        "",
        "## Attribution",
        "",
        md_table(attribution_rows(data)),
        "",
        "## Medians over runs [min-max, CV]",
        "",
        md_table(spread_rows(data)),
        "",
    ]
    turns = turn_rows(data)
    if len(turns) > 1:
        lines += ["## TTFT by turn index", "", md_table(turns), ""]
    lines += ["## Over time, per run", "", timeseries.markdown_line(data), ""]
    per, cap_effects, suggested = sections.sections(data)
    if per:
        lines += ["## Capacity under SLOs", "", md_table(sections.capacity_rows(
            per, cap_effects, sections.capacity_throttle(data))),
                  ""] + [f"- {e.sentence()}" for e in cap_effects] + [""]
    stops = stopping_lines(data)
    if stops:
        lines += ["## Stopping rule and interference", ""] + [f"- {x}" for x in stops] + [""]
    if data.analysis.warnings:
        lines += ["## Warnings", ""] + [f"- {w}" for w in data.analysis.warnings] + [""]
    lines += sections.decision_markdown(
        hyp, result + [e.sentence() for e in cap_effects], suggested
    )
    lines += [
        "## Runs (provenance)",
        "",
        md_table(
            [[head for _, head in PROV_COLUMNS] + ["error"]]
            + [
                [str(p[k]) for k, _ in PROV_COLUMNS] + [p["error"][:80]]
                for p in provenance_rows(data)
            ]
        ),
        "",
    ]
    return no_raw_html("\n".join(lines))


# what CommonMark reads as raw HTML: '<' followed by a tag name, '/', '!' or '?'
_TAG_START = re.compile(r"<(?=[A-Za-z/!?])")


def no_raw_html(text: str) -> str:
    """`text` with every raw-HTML opening escaped: the hypothesis, arm names, server errors
    and log lines are other people's words, and a markdown viewer must show them, not run them
    (`p < 0.05` and `ttft <= 75` stay as written)."""
    return _TAG_START.sub("&lt;", text)
