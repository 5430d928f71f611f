"""A self-contained HTML page for a profile report (and a ceiling): tables plus inline SVG bars.

No scripts, no external files: the page opens anywhere and prints. Verdict first (host-bound or
not), then the step timeline, categories with the most each could give, top kernels, what-ifs,
the diff against `--vs`, and provenance.
"""

from __future__ import annotations

import html
import json
from typing import Any

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.25em .6em;border-bottom:1px solid #eee}
th{text-align:left;background:#f6f6f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
.verdict{padding:.7em 1em;border-radius:6px;background:#eef6ee}.hb{background:#fdf0e6}
code{font-size:12px}.muted{color:#777}
"""
_COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"]


def _e(x: Any) -> str:
    return html.escape(str(x))


def _f(x: float | None, nd: int = 1) -> str:
    return "n/a" if x is None else f"{x:,.{nd}f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _table(head: list[str], rows: list[list[str]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td class='n'>{c}</td>" if i in numeric else f"<td>{c}</td>"
                         for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


def _bars(items: list[tuple[str, float]], unit: str, width: int = 640) -> str:
    """Horizontal bar chart as inline SVG."""
    if not items:
        return ""
    top = max(v for _, v in items) or 1.0
    h = 22
    rows = []
    for k, (label, v) in enumerate(items):
        w = max(1.0, (width - 380) * v / top)  # room for the value label
        y = k * h
        rows.append(
            f"<text x='0' y='{y + 15}' font-size='12'>{_e(label[:34])}</text>"
            f"<rect x='240' y='{y + 3}' width='{w:.1f}' height='{h - 6}' "
            f"fill='{_COLORS[k % len(_COLORS)]}'/>"
            f"<text x='{245 + w:.1f}' y='{y + 15}' font-size='12'>{v:,.1f} {unit}</text>"
        )
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{h * len(items)}' "
            f"role='img'>{''.join(rows)}</svg>")


def _timeline(steps: list[dict], width: int = 1000) -> str:
    """Per-step stacked bar: GPU busy vs idle."""
    if not steps:
        return ""
    top = max(s["wall_us"] for s in steps) or 1.0
    h = 16
    rows = []
    for k, s in enumerate(steps[:60]):
        y = k * h
        wb = (width - 120) * s["gpu_busy_us"] / top
        wi = (width - 120) * (s["wall_us"] - s["gpu_busy_us"]) / top
        rows.append(
            f"<text x='0' y='{y + 12}' font-size='11'>#{s['index']}</text>"
            f"<rect x='40' y='{y + 2}' width='{wb:.1f}' height='{h - 4}' fill='#4e79a7'/>"
            f"<rect x='{40 + wb:.1f}' y='{y + 2}' width='{max(wi, 0):.1f}' height='{h - 4}' "
            "fill='#ddd'/>"
        )
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' "
            f"height='{h * min(len(steps), 60)}' role='img'>{''.join(rows)}</svg>"
            "<p class='muted'>blue: GPU busy (union of kernels), grey: GPU idle</p>")


def profile_html(report: dict[str, Any], vs: dict[str, Any] | None = None) -> str:
    """Render a profile report (the `--json` dict) as one HTML page."""
    r = report
    parts = [f"<h1>GPU profile: {_e(r['trace'])}</h1>"]
    focus = r["phases"].get(r.get("focus_phase") or "") if r.get("phases") else None
    cls = "verdict hb" if (focus or r)["host_bound"] else "verdict"
    parts.append(f"<p class='{cls}'><b>{_e(r['verdict'])}</b></p>")
    if r.get("all_steps"):
        parts.append(f"<p>{_e(r['all_steps'])}</p>")
    g = r["cuda_graphs"]
    parts.append(_table(
        ["steps", "found by", "mean step (us)", "GPU busy", "idle", "outside steps", "CUDA graphs"],
        [[str(r["n_steps"]), _e(r["steps_from"]), _f(r["wall_us"] / max(r["n_steps"], 1)),
          _pct(r["gpu_busy_fraction"]), _pct(r["idle_fraction"]),
          f"{r['outside_steps']['n_activities']} activities, {_f(r['outside_steps']['time_us'])} us",
          f"{g['graph_launches']} launches, {g['kernels_in_graphs']} kernels"
          + (f", {_f(g['mean_launch_busy_us'])} of {_f(g['mean_launch_span_us'])} us busy per replay"
             if g["graph_launches"] else "")]],
    ))
    if r.get("warmup_steps"):
        parts.append("<h2>Warm-up steps (kept out of the phase figures)</h2>" + _table(
            ["step", "name", "wall (us)", "why"],
            [[str(w["index"]), _e(w["name"]), _f(w["wall_us"]), _e(w["reason"])]
             for w in r["warmup_steps"]], numeric={0, 2}))
    if r.get("phases"):
        parts.append("<h2>Phases (steady state)</h2>" + _table(
            ["phase", "role", "steps", "warm-up", "batch", "median step (us)", "GPU busy", "bound",
             "verdict"],
            [[_e(name), _e(p.get("role", "")), str(p["n_steps"]), str(p.get("n_warmup", 0)),
              _e("/".join(map(str, p.get("batch_sizes") or {}))), _f(p.get("median_step_us")),
              _pct(p["gpu_busy_fraction"]),
              {True: "host", False: "GPU"}.get(p["host_bound"], "-"),
              _e(p.get("verdict", ""))] for name, p in r["phases"].items()],
            numeric={2, 3, 5, 6},
        ))
        for name, p in r["phases"].items():
            if p.get("categories"):
                parts.append(f"<h3>{_e(name)}: categories</h3>" + _table(
                    ["category", "per step (us)", "share", "only it runs (us/step)", "if free"],
                    [[_e(c["category"]), _f(c["total_us"] / max(p["n_steps"], 1)),
                      _pct(c["share"]), _f(c["exclusive_us"] / max(p["n_steps"], 1)),
                      f"{_f(c['max_speedup_if_free'], 2)}x"] for c in p["categories"]],
                    numeric={1, 2, 3, 4}))
            if p.get("what_if"):
                w = p["what_if"]
                parts.append(f"<p>what-if {_e(', '.join(w['specs']))} on {_e(name)}: "
                             f"{_f(w['per_step_us'])} -> {_f(w['new_per_step_us'])} us/step, "
                             f"{_f(w['speedup'], 3)}x ({_e(w['note'])})</p>")
    if r.get("mix_bound"):
        m = r["mix_bound"]
        parts.append(f"<h2>Workload-weighted bound ({_e(m['source'])})</h2>" + _table(
            ["category made free", "workload speedup", "per phase"],
            [[_e(b["category"]), f"{_f(b['speedup_if_free'], 3)}x",
              _e(", ".join(f"{h} {_f(v, 2)}x" for h, v in b["per_phase"].items()))]
             for b in m["bounds"]], numeric={1}))
    parts.append("<h2>Steps</h2>" + _timeline(r["steps"]))
    parts.append("<h2>All steps (secondary): time and the most each category could give</h2>")
    parts.append(_bars([(c["category"], c["per_step_us"]) for c in r["categories"]], "us/step"))
    parts.append(_table(
        ["category", "total (us)", "share", "count", "per step (us)", "only it runs, total (us)",
         "if free"],
        [[_e(c["category"]), _f(c["total_us"]), _pct(c["share"]), str(c["count"]),
          _f(c["per_step_us"]), _f(c["exclusive_us"]),
          f"{_f(c['max_speedup_if_free'], 2)}x"] for c in r["categories"]],
        numeric={1, 2, 3, 4, 5, 6},
    ))
    parts.append("<h2>Top kernels</h2>")
    parts.append(_table(
        ["kernel", "category", "count", "total (us)", "mean (us)", "share"],
        [[f"<code title='{_e(k['name'])}'>{_e(k['short'])}</code>", _e(k["category"]),
          str(k["count"]), _f(k["total_us"]), _f(k["mean_us"], 2), _pct(k["share"])]
         for k in r["top_kernels"]],
        numeric={2, 3, 4, 5},
    ))
    if r.get("what_if"):
        w = r["what_if"]
        parts.append("<h2>What if</h2>")
        parts.append(_table(
            ["what-if", "step (us)", "new step (us)", "speedup", "note"],
            [[_e(", ".join(w["specs"])), _f(w["per_step_us"]), _f(w["new_per_step_us"]),
              f"{_f(w['speedup'], 3)}x", _e(w["note"])]],
            numeric={1, 2, 3},
        ))
    if vs:
        for name, d in vs.get("phases", {}).items():
            parts.append(f"<h2>A vs B, {_e(name)} steps: {_f(d['a_step_us'])} -> "
                         f"{_f(d['b_step_us'])} us (B/A {_f(d['step_ratio'], 3)})</h2>" + _table(
                ["category", "A us/step", "B us/step", "delta (us)", "B/A"],
                [[_e(x["key"]), _f(x["a_per_step_us"]), _f(x["b_per_step_us"]),
                  _f(x["delta_us"]), _f(x["ratio"], 3)] for x in d["categories"]],
                numeric={1, 2, 3, 4}))
        parts.append(f"<h2>A vs B, all steps: {_e(vs['a'])} vs {_e(vs['b'])}</h2>")
        parts.append(f"<p>step: {_f(vs['a_step_us'])} us -> {_f(vs['b_step_us'])} us "
                     f"(B/A {_f(vs['step_ratio'], 3)})</p>")
        for title, key in (("categories", "categories"), ("kernels", "kernels")):
            parts.append(_table(
                [title, "A us/step", "B us/step", "delta (us)", "B/A"],
                [[_e(x.get("short", x["key"])), _f(x["a_per_step_us"]),
                  _f(x["b_per_step_us"]), _f(x["delta_us"]), _f(x["ratio"], 3)] for x in vs[key]],
                numeric={1, 2, 3, 4},
            ))
    prov = r.get("provenance")
    if prov:
        parts.append("<h2>Provenance</h2><pre>" + _e(json.dumps(prov, indent=1, default=str)) + "</pre>")
    return _page("servelab profile", "".join(parts))


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{_CSS}</style></head><body>{body}</body></html>")
