"""The report's tables as rows of text, shared by the markdown (markdown.py) and the HTML
(html.py): the attribution table, the medians over runs, and every run with its provenance."""

from __future__ import annotations

import math
import time
from typing import Any

from servelab.experiment.design.metrics import ENERGY_METRIC, METRICS
from servelab.experiment.report.noise import interference_cells
from servelab.experiment.stats.analysis import headline
from servelab.experiment.stats.evidence import Evidence
from servelab.experiment.stats.throttle import with_note
from servelab.experiment.stats.turns import ttft_by_turn


def _num(x: float, digits: int = 4) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


def attribution_rows(data: Evidence) -> list[list[str]]:
    """Header + one row per arm x load point: medians, the effect with CI and verdict (with the
    GPU throttling that could have moved it), and energy per output token beside the decided
    metric (its median and change; n/a without a GPU)."""
    an, pm = data.analysis, data.primary
    energy = pm != ENERGY_METRIC
    head = [
        "arm",
        "load",
        "runs",
        f"{METRICS[pm].label} ({METRICS[pm].unit})",
        *([f"{METRICS[ENERGY_METRIC].unit} (change)"] if energy else []),
        "vs baseline [95% CI]",
        VERDICT,
        "TTFT change",
        "TPOT change",
        "accept len",
    ]
    rows = [head]
    for arm in an.arms:
        for lk in an.load_keys:
            s = an.spreads[(arm, lk, pm)]
            acc = an.spreads[(arm, lk, "accept_length")].median
            j = _num(an.spreads[(arm, lk, ENERGY_METRIC)].median, 3)
            if arm == an.baseline:
                eff, verdict, ttft, tpot = "(baseline)", "", "", ""
            else:
                e = an.effects[(arm, lk, pm)]
                eff, verdict = e.text(), with_note(e.verdict, an.verdict_note(arm, lk))
                et, ep = an.effects[(arm, lk, "ttft_ms")], an.effects[(arm, lk, "tpot_ms")]
                ttft = f"{et.text()} {et.verdict}"
                tpot = f"{ep.text()} {ep.verdict}"
                ej = an.effects[(arm, lk, ENERGY_METRIC)]
                if ej.verdict != "n/a":
                    j += f" ({ej.text()} {ej.verdict})"
            spread = (
                f"{_num(s.median)} (CV {s.cv * 100:.1f}%)"
                if math.isfinite(s.cv)
                else _num(s.median)
            )
            rows.append([arm, lk, str(s.n), spread, *([j] if energy else []), eff, verdict, ttft,
                         tpot, _num(acc, 3)])
    return rows


VERDICT = "verdict"


def verdict_word(rows: list[list[str]], row: list[str]) -> str:
    """The verdict of an attribution row (`better`, `worse`, ...), without its throttling note:
    what the renderers colour the row by."""
    cell = row[rows[0].index(VERDICT)]
    return cell.split("  (", 1)[0]


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
