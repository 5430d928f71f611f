"""The report's time-series panel: what each run's load point looked like over its duration,
from the telemetry stored beside it (telemetry/point.py, `Store.telemetry`): the engine's
generated tokens per second (the rate of its scraped counter), its queued requests and
KV-cache usage, and the GPUs' SM clock and power, on one time axis in seconds from the load's
first request. One panel per load point, the arms overlaid, a selector for the block
(repetition); the HTML draws it with the vendored uPlot (report/assets/timeseries.js).

Nothing is invented: a quantity a run did not measure (no GPU, an engine that does not serve
KV-cache usage) is left out of that run and, when no run has it, the panel says so instead of
drawing it; a sample with no reading stays null, never 0. Runs without a stored series (telemetry
off, an import, a store of an earlier release) or whose file went missing are named in a note.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servelab.errors import UserError
from servelab.experiment.stats.evidence import Evidence
from servelab.store import Store

# (key, label, unit, where it comes from): the charts in the panel, top to bottom
QUANTITIES = (
    ("gen_tok_s", "generated tokens/s", "tok/s", "server"),
    ("queued_requests", "queued requests", "requests", "server"),
    ("kv_cache_usage_pct", "KV-cache usage", "%", "server"),
    ("sm_clock_mhz", "SM clock (mean over GPUs)", "MHz", "gpu"),
    ("power_w", "GPU power (sum over GPUs)", "W", "gpu"),
)

Series = tuple[list[float | None], list[float | None]]  # (seconds from the load's start, values)
COARSE = 4  # a load shorter than this many scrape intervals is named as coarse


@dataclass
class Panels:
    """The panel's data: per load key, per block, per arm, each quantity's series."""

    arms: list[str]
    load_keys: list[str]
    # load key -> block label -> arm -> quantity -> series
    runs: dict[str, dict[str, dict[str, dict[str, Series]]]] = field(default_factory=dict)
    # load key -> block label -> arm -> the last answer, seconds from the load's start
    load_end_s: dict[str, dict[str, dict[str, float | None]]] = field(default_factory=dict)
    gpu_status: dict[str, str] = field(default_factory=dict)  # load key -> a GPU status seen
    notes: list[str] = field(default_factory=list)  # runs without a stored series
    # load key -> (its shortest load s, the scrape interval s) when the load lasted under
    # COARSE scrapes: a run's series is then a few samples, and the page says how to refine it
    coarse: dict[str, tuple[float, float]] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # series files missing or damaged

    def shown(self, load_key: str) -> list[str]:
        """The quantities some run at `load_key` measured, in QUANTITIES order."""
        have = {q for blk in self.runs.get(load_key, {}).values() for arm in blk.values()
                for q, (_, ys) in arm.items() if any(y is not None for y in ys)}
        return [k for k, *_ in QUANTITIES if k in have]

    def missing_notes(self, load_key: str) -> list[str]:
        """One line per quantity no run at `load_key` measured, and why."""
        shown, out = set(self.shown(load_key)), []
        if not self.runs.get(load_key):
            return out
        for key, label, _, src in QUANTITIES:
            if key in shown:
                continue
            status = self.gpu_status.get(load_key) or "n/a"
            why = ("the engine's /metrics does not serve it" if src == "server"
                   else "a GPU gives no such reading" if status == "ok"
                   else f"GPU telemetry {status}")
            out.append(f"{label}: not measured ({why}); left out, not drawn as 0")
        if load_key in self.coarse:
            dur, iv = self.coarse[load_key]
            out.append(f"loads as short as {dur:.2g} s against a scrape every {iv:g} s: a few "
                       "samples per run; [workload] scrape_interval_s (servelab bench "
                       "--scrape-interval) sets a finer grid")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "arms": self.arms,
            "quantities": [{"key": k, "label": lab, "unit": u} for k, lab, u, _ in QUANTITIES],
            "panels": [
                {"load_key": lk, "shown": self.shown(lk), "notes": self.missing_notes(lk),
                 "blocks": [{"label": b, "runs": {a: {q: [list(t), list(y)] for q, (t, y) in qs.items()}
                                                  for a, qs in arms.items()},
                             "load_end_s": self.load_end_s.get(lk, {}).get(b, {})}
                            for b, arms in self.runs[lk].items()]}
                for lk in self.load_keys if lk in self.runs
            ],
            "notes": self.notes + [f"{m}: left out of the panel" for m in self.unreadable],
        }


def _r(x: float | None, digits: int = 4) -> float | None:
    """Rounded to `digits` significant digits (the page carries every sample); None stays."""
    if x is None or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def _col(values: Mapping[str, Any], name: str, n: int) -> list[float | None]:
    col = values.get(name)
    return list(col)[:n] if isinstance(col, list) and len(col) >= n else [None] * n


def server_series(tel: Mapping[str, Any], t0: float) -> dict[str, Series]:
    """The engine's quantities of one stored series: the generated-token counter as a rate over
    each scrape interval (at its midpoint; None across a reset or a failed scrape; the stop's
    last interval left out when under half the scrape interval and not the only one), the
    queue and the KV-cache usage (a fraction, shown in %) as read."""
    srv = tel.get("server") or {}
    ts = [float(t) for t in srv.get("t_s") or []]
    vals, n = srv.get("series") or {}, len(ts)
    out: dict[str, Series] = {}
    gen = _col(vals, "generation_tokens", n)
    iv = srv.get("interval_s")
    short = 0.5 * iv if isinstance(iv, int | float) and iv > 0 else 0.0
    if any(v is not None for v in gen) and n >= 2:
        t_mid, rate = [], []
        for i in range(1, n):
            a, b, dt = gen[i - 1], gen[i], ts[i] - ts[i - 1]
            if dt < short and i == n - 1 and t_mid:  # the stop's scrape, a sliver after the
                continue  # last: a few tokens over it read as a spike (kept when it is all)
            t_mid.append(_r((ts[i] + ts[i - 1]) / 2 - t0, 6))
            rate.append(_r((b - a) / dt) if a is not None and b is not None and b >= a and dt > 0
                        else None)
        out["gen_tok_s"] = (t_mid, rate)
    t_rel = [_r(t - t0, 6) for t in ts]
    for name, key, scale in (("queued_requests", "queued_requests", 1.0),
                             ("kv_cache_usage", "kv_cache_usage_pct", 100.0)):
        col = _col(vals, name, n)
        if any(v is not None for v in col):
            out[key] = (t_rel, [_r(v * scale) if v is not None else None for v in col])
    return out


def gpu_series(tel: Mapping[str, Any], t0: float) -> dict[str, Series]:
    """The GPUs' SM clock (mean of the GPUs that read it) and power (sum over the GPUs; None
    when one GPU has no reading: a partial sum would read low), per sample, on the scraper's
    clock (the stored offset) from the load's start."""
    gpu = tel.get("gpu") or {}
    per = [g for g in (gpu.get("series") or {}).values() if isinstance(g, Mapping)]
    if gpu.get("status") != "ok" or not per:
        return {}
    n = min(len(g.get("t_s") or []) for g in per)
    shift = float(tel.get("gpu_clock_offset_s") or 0.0) - t0
    t = [_r(sum(float(g["t_s"][i]) for g in per) / len(per) + shift, 6) for i in range(n)]
    out: dict[str, Series] = {}
    clk = [_col(g, "sm_clock_mhz", n) for g in per]
    pw = [_col(g, "power_w", n) for g in per]
    clocks = [[c[i] for c in clk if c[i] is not None] for i in range(n)]
    if any(clocks):
        out["sm_clock_mhz"] = (t, [_r(sum(c) / len(c)) if c else None for c in clocks])
    power = [[p[i] for p in pw] for i in range(n)]
    if any(x is not None for p in power for x in p):
        out["power_w"] = (t, [_r(sum(p)) if all(x is not None for x in p) else None
                              for p in power])
    return out


def run_series(tel: Mapping[str, Any]) -> dict[str, Series]:
    """Every quantity one stored telemetry series holds, from the load's first request."""
    t0 = tel.get("load_start_s")
    t0 = float(t0) if isinstance(t0, int | float) else 0.0
    got = {**server_series(tel, t0), **gpu_series(tel, t0)}
    return {k: v for k, v in got.items() if any(y is not None for y in v[1])}  # no reading: out


def collect(data: Evidence, store: Store) -> Panels:
    """The panel's data of every ok run that counts; runs without a readable series named."""
    excluded = set(data.excluded)
    pan = Panels(arms=list(data.analysis.arms), load_keys=list(data.analysis.load_keys))
    none_kept = 0
    for r in sorted(data.runs, key=lambda r: (r.block if r.block is not None else r.repetition,
                                              r.seq)):
        lp = data.load_points.get(r.load_point_id) if r.load_point_id else None
        if r.status != "ok" or lp is None or r.block in excluded:
            continue
        try:
            tel = store.telemetry(lp)
        except UserError as exc:  # the file moved or came back damaged: the report still renders
            pan.unreadable.append(str(exc))
            continue
        if tel is None:
            none_kept += 1
            continue
        label = f"block {r.block + 1}" if r.block is not None else f"rep {r.repetition + 1}"
        blk = pan.runs.setdefault(r.load_key, {}).setdefault(label, {})
        blk[r.arm] = run_series(tel)
        t0, t1 = tel.get("load_start_s"), tel.get("load_end_s")
        pan.load_end_s.setdefault(r.load_key, {}).setdefault(label, {})[r.arm] = (
            _r(t1 - t0, 6) if isinstance(t0, int | float) and isinstance(t1, int | float)
            else None)
        _note_coarse(pan, r.load_key, tel)
        status = (tel.get("gpu") or {}).get("status")
        if status and r.load_key not in pan.gpu_status:
            pan.gpu_status[r.load_key] = str(status)
    if none_kept:
        pan.notes.append(f"{none_kept} run(s) have no stored time series (telemetry off, an "
                         "import, or a store of an earlier release): left out of the panel")
    return pan


def _note_coarse(pan: Panels, load_key: str, tel: Mapping[str, Any]) -> None:
    """Keep the shortest load at `load_key` when it lasted under COARSE scrape intervals."""
    t0, t1 = tel.get("load_start_s"), tel.get("load_end_s")
    iv = (tel.get("server") or {}).get("interval_s")
    if not all(isinstance(x, int | float) for x in (t0, t1, iv)) or iv <= 0:
        return
    dur = t1 - t0
    if dur < COARSE * iv and dur < pan.coarse.get(load_key, (math.inf, iv))[0]:
        pan.coarse[load_key] = (dur, iv)


def markdown_line(data: Evidence) -> str:
    """Where the markdown report points for the time series (it has no charts)."""
    ok = [data.load_points[r.load_point_id] for r in data.runs
          if r.status == "ok" and r.load_point_id in data.load_points]
    kept = sum(1 for lp in ok if lp.telemetry_path)
    return (f"Generated tok/s, queued requests, KV-cache usage, SM clock and GPU power of each "
            f"run over its load point: the time-series panel of report.html ({kept} of "
            f"{len(ok)} ok runs stored a series; a file missing since is named among the "
            f"warnings).")


def counts(pan: Panels) -> Sequence[int]:
    """(panels, charts) the page should draw: what its script reports once drawn."""
    return len(pan.runs), sum(len(pan.shown(lk)) for lk in pan.runs)
