"""The report's newer sections, shared by the markdown and the self-contained HTML
(report/markdown.py and report/html.py assemble them):

- **Trade-off**: interactive charts (uPlot, vendored under report/vendor/ and inlined with its
  licence: the page fetches nothing) of TTFT / TPOT / E2E at p50, p95, p99 against throughput
  per arm with the SLO limits drawn, and tok/s per user against tok/s per GPU (Pareto);
  hover shows the values, checkboxes toggle arms and percentiles (data: report/tradeoff.py).
- **Time series**: per load point, each run's generated tok/s, queue, KV-cache usage, SM clock
  and power over the load, arms overlaid, a selector for the block (report/timeseries.py).
- **Capacity under SLOs**: each arm's bracket and the effect with its CI and verdict, as the
  analysis states them (stats/capacity.py; never recomputed here).
- **Decision record**: a suggestion drawn from the verdicts, and empty fields for the human's
  decision, who made it and why.
- **Provenance as tables**: nested server info / settings as key-value rows, not a dict dump.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from importlib import resources
from typing import Any

import orjson

from servelab.experiment.design.metrics import METRICS
from servelab.experiment.design.sweep import SWEEP_KEY
from servelab.experiment.stats.analysis import Analysis
from servelab.experiment.stats.capacity import ArmCapacity, CapacityEffect
from servelab.experiment.stats.evidence import Evidence
from servelab.experiment.stats.throttle import with_note

UPLOT_VERSION = "1.6.32"

CSS = """
.u-legend{font-size:11px;line-height:1.1}.u-legend .u-series{padding:0 4px}
.toggles{margin:.5em 0;font-size:14px}.toggles label{margin-right:1em;cursor:pointer}
.charts{display:flex;flex-wrap:wrap;gap:8px}.chart{border:1px solid #ddd;padding:4px}
.kv td:first-child{color:#555;white-space:nowrap}.kv{font-size:12px}
.decision td[contenteditable]{background:#fffff0;min-width:30em}
.capacity .better{color:#080;font-weight:bold}.capacity .worse{color:#b00;font-weight:bold}
"""


def _asset(folder: str, name: str) -> str:
    """A file shipped in the package (report/vendor, report/assets)."""
    return resources.files("servelab.experiment.report").joinpath(folder, name).read_text(encoding="utf-8")


def _script_json(obj: Any) -> str:
    """JSON safe inside <script> (no `</` that could close it)."""
    return orjson.dumps(obj).decode().replace("</", "<\\/")


def tradeoff_html(payload: Mapping[str, Any]) -> str:
    """The charts' section: inlined uPlot (MIT, its licence in a comment), data, our script."""
    vend = "vendor"
    lic = _asset(vend, "uPlot.LICENSE").replace("*/", "* /")
    return "\n".join([
        f"<style>{_asset(vend, 'uPlot.min.css')}{CSS}</style>",
        f"<script>/* uPlot {UPLOT_VERSION}, vendored from npm 'uplot'.\n{lic}*/\n"
        f"{_asset(vend, 'uPlot.iife.min.js')}</script>",
        "<div id='tradeoff'></div>",
        f"<script type='application/json' id='tradeoff-data'>{_script_json(payload)}</script>",
        f"<script>{_asset('assets', 'tradeoff.js')}</script>",
    ])


TS_CSS = """
.ts-panel{border-top:1px solid #ddd;margin-top:.8em}.ts-panel h3{margin:.4em 0}
.ts-notes,.ts-missing{font-size:12px;color:#555}
"""


def timeseries_html(payload: Mapping[str, Any]) -> str:
    """The time-series panel (report/timeseries.py's data, report/assets/timeseries.js): after
    `tradeoff_html`, whose inlined uPlot it draws with."""
    return "\n".join([
        f"<style>{TS_CSS}</style>",
        "<div id='timeseries'></div>",
        f"<script type='application/json' id='timeseries-data'>{_script_json(payload)}</script>",
        f"<script>{_asset('assets', 'timeseries.js')}</script>",
    ])


# ---- capacity ------------------------------------------------------------------------------------


def capacity_throttle(data: Evidence) -> dict[str, str | None]:
    """arm -> the throttling note of its capacity runs (or the baseline's), for capacity_rows."""
    an = data.analysis
    return {a: an.throttle_note(a, SWEEP_KEY) for a in an.arms if a != an.baseline}


def sections(data: Evidence) -> tuple[list[ArmCapacity], list[CapacityEffect], list[str]]:
    """(capacity per arm, capacity effects, suggested decisions) of an experiment's evidence;
    the capacity parts are empty until a sweep ([load.sweep]) has run."""
    an = data.analysis
    per = an.capacity_arms
    effects = [an.capacity[a] for a in an.arms if a != an.baseline] if per else []
    return per, effects, suggestion(an, data.primary, effects)


def capacity_rows(per: list[ArmCapacity], effects: list[CapacityEffect],
                  throttled: Mapping[str, str | None] | None = None) -> list[list[str]]:
    """The capacity table; `throttled`: arm -> the GPU throttling note of its capacity runs or
    the baseline's (Analysis.throttle_note), shown beside the verdict."""
    by = {e.arm: e for e in effects}
    notes = throttled or {}
    rows = [["arm", "SLO capacity (req/s)", "each sweep's bracket", "vs baseline [95% CI]",
             "verdict", "open brackets"]]
    for a in per:
        e = by.get(a.arm)
        rows.append([a.arm, a.text(), ", ".join(b.text() for b in a.brackets),
                     e.pct_text() if e else "(baseline)",
                     with_note(e.verdict, notes.get(a.arm)) if e else "",
                     f"{e.open_blocks} of {e.n} blocks" if e else ""])
    return rows


# ---- decision record -----------------------------------------------------------------------------


def suggestion(an: Analysis, primary: str, effects: list[CapacityEffect]) -> list[str]:
    """What the verdicts suggest, per arm; the decision itself stays the human's."""
    out = []
    label = METRICS[primary].label
    for arm in an.arms:
        if arm == an.baseline:
            continue
        v: dict[str, list[str]] = {}
        for lk in an.load_keys:
            e = an.effects.get((arm, lk, primary))
            if e is not None:
                v.setdefault(e.verdict, []).append(lk)
        cap = next((e for e in effects if e.arm == arm), None)
        good, bad = v.get("better", []), v.get("worse", [])
        if cap is not None:
            (good if cap.verdict == "better" else bad if cap.verdict == "worse" else []).append(
                "SLO capacity")
        open_ = [lk for k, lks in v.items() if k not in ("better", "worse", "secondary")
                 for lk in lks]
        shown = v.get("secondary", [])  # intervals only: no verdict to suggest from
        if cap is not None and cap.verdict not in ("better", "worse"):
            open_.append("SLO capacity")
        if good and not bad:
            s = f"adopt {arm}: better {label if good != ['SLO capacity'] else ''} at {', '.join(good)}"
        elif bad and not good:
            s = f"reject {arm}: worse at {', '.join(bad)}"
        elif good and bad:
            s = f"{arm} is a trade-off: better at {', '.join(good)}, worse at {', '.join(bad)}"
        else:
            s = f"{arm}: no measured change; keep {an.baseline} or measure more"
        if open_ and (good or bad):
            s += f"; not decided or no change at {', '.join(open_)}"
        if shown:
            s += f"; {', '.join(shown)} shown without a verdict (secondary)"
        out.append(" ".join(s.split()))
    return out


DECISION_FIELDS = ("decision (adopt / reject / measure more)", "decided by", "date", "rationale")


def decision_markdown(hyp: str, results: list[str], suggested: list[str]) -> list[str]:
    lines = ["## Decision record", "", f"- Hypothesis: {hyp}"]
    lines += [f"- Result: {r}" for r in results]
    lines += [f"- Suggested by the verdicts: {s}" for s in suggested]
    lines += ["- Decision: (to fill in: adopt / reject / measure more)", "- Decided by: (to fill in)",
              "- Date: (to fill in)", "- Rationale: (to fill in)"]
    return lines + [""]


def decision_html(hyp: str, results: list[str], suggested: list[str]) -> str:
    rows = [("hypothesis", html.escape(hyp)),
            ("result", "<br>".join(html.escape(x) for x in results)),
            ("suggested by the verdicts", "<br>".join(html.escape(x) for x in suggested))]
    out = ["<table class='decision'>"]
    out += [f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows]
    out += [f"<tr><th>{html.escape(f)}</th><td contenteditable='true'></td></tr>"
            for f in DECISION_FIELDS]
    return "\n".join(out) + "</table>"


# ---- provenance ----------------------------------------------------------------------------------


def _flat(obj: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(obj, Mapping):
        out: list[tuple[str, str]] = []
        for k, v in obj.items():
            out += _flat(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(obj, list) and obj and all(isinstance(x, Mapping) for x in obj):
        out = []
        for i, v in enumerate(obj):
            out += _flat(v, f"{prefix}[{i}]")
        return out
    if isinstance(obj, float) and not math.isfinite(obj):
        return [(prefix, "n/a")]
    text = ", ".join(map(str, obj)) if isinstance(obj, list) else "" if obj is None else str(obj)
    return [(prefix, text)]


def kv_table(obj: Any, limit: int = 200) -> str:
    """A nested mapping as a two-column table of dotted keys (`internal_states[0].x`)."""
    rows = _flat(obj)
    if not rows:
        return "<p>(none)</p>"
    more = f"<tr><td colspan='2'>... {len(rows) - limit} more</td></tr>" if len(rows) > limit else ""
    return ("<table class='kv'>" + "".join(
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(v[:300])}</td></tr>" for k, v in rows[:limit])
        + more + "</table>")
