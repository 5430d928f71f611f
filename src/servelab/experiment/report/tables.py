"""The report's tables as rows of text, shared by the markdown (markdown.py) and the HTML
(html.py): the attribution table, the medians over runs, and every run with its provenance."""

from __future__ import annotations

import math
import time
from typing import Any

from servelab.experiment.design.metrics import METRICS
from servelab.experiment.report.noise import interference_cells
from servelab.experiment.stats.analysis import headline
from servelab.experiment.stats.evidence import Evidence
from servelab.experiment.stats.turns import ttft_by_turn


def _num(x: float, digits: int = 4) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


def attribution_rows(data: Evidence) -> list[list[str]]:
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


def spread_rows(data: Evidence) -> list[list[str]]:
    """Header + one row per arm x load point: every metric's median over runs with its spread
    (min-max over runs, CV), so latency and acceptance are visible per run, not only as effects."""
    an = data.analysis
    # a descriptive metric no run measured (no cache report, a closed loop) gets no column
    shown = [k for k, m in METRICS.items() if m.higher_is_better is not None or k == "accept_length"
             or any(an.spreads[(a, lk, k)].n for a in an.arms for lk in an.load_keys)]
    rows = [["arm", "load", "runs"] + [f"{METRICS[k].label} ({METRICS[k].unit})" for k in shown]]
    for arm in an.arms:
        for lk in an.load_keys:
            cells = []
            for key in shown:
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


def turn_rows(data: Evidence) -> list[list[str]]:
    """Header + one row per arm x load point x turn of a multi-turn workload: TTFT median and
    p90 by turn index, medians over runs of what each run stored (stats/turns.py); only the
    header when no run has turns."""
    rows = [["arm", "load", "turn", "runs", "TTFT median (ms)", "TTFT p90 (ms)",
             "input tokens (median)"]]
    for t in ttft_by_turn(data):
        rows.append([t.arm, t.load_key, str(t.turn), str(t.runs), _num(t.ttft_median_ms),
                     _num(t.ttft_p90_ms), _num(t.input_tokens, 6)])
    return rows


# (key in a provenance_rows row, column heading): the run columns both renderers show
PROV_COLUMNS = (
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

def provenance_rows(data: Evidence) -> list[dict[str, Any]]:
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


def decision(data: Evidence) -> tuple[str, list[str]]:
    """(the hypothesis, the headline of each arm's effect)."""
    return data.spec.hypothesis or "(none given)", headline(data.analysis, data.primary)
