"""Tables of load-point summaries (the `bench` summary and `results show|list`).

Every cell is a plain string: the console prints it literally (servelab.console), so a label,
model id or error message from outside is shown as it is. Missing values show as "-", never
as "None" or 0; percentiles beyond ours (an imported file's p95) get their own column.
"""

from __future__ import annotations

import math
import time
from typing import Any

from rich.table import Table


def _f(x: Any, nd: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return str(x)


NAMES = {"ttft_ms": "TTFT ms", "tpot_ms": "TPOT ms", "itl_ms": "ITL ms (per token)",
         "chunk_gap_ms": "chunk gap ms", "e2e_ms": "E2E ms"}


def _columns(s: dict[str, Any]) -> list[str]:
    """mean, median, every percentile some metric has (p90, p95, p99, ...), std."""
    pcts = {"p90", "p99"}
    for key in NAMES:
        st = s.get(key)
        if isinstance(st, dict):
            pcts |= {k for k, v in st.items() if k.startswith("p") and v is not None}

    def rank(k: str) -> float:
        try:
            return float(k[1:])
        except ValueError:
            return math.inf

    return ["mean", "median", *sorted(pcts, key=rank), "std"]


def summary_table(s: dict[str, Any], title: str | None = None) -> Table:
    """Latency stats (ms) and throughput of one load point."""
    t = Table(title=title or f"load point {s.get('load_key')}", title_justify="left")
    t.add_column("metric")
    cols = _columns(s)
    for k in cols:
        t.add_column(k, justify="right")
    for key, name in NAMES.items():
        st = s.get(key) if isinstance(s.get(key), dict) else {}
        t.add_row(name, *(_f(st.get(k)) for k in cols))
        if key == "ttft_ms" and s.get("cached_tokens_reported"):  # the cache beside the TTFT
            ct = s.get("cached_tokens") or {}
            t.add_row("cached tokens/req", *(_f(ct.get(k), 1) for k in cols))
        if key == "ttft_ms":
            for name_, cells in turn_rows(s):
                t.add_row(name_, *(cells.get(k, "") for k in cols))
    t.add_section()
    rows = [
        ("completed / failed", f"{_f(s.get('completed'))} / {_f(s.get('failed'))}"),
        ("failure reasons", ", ".join(f"{k}: {v}" for k, v in (s.get("failure_reasons") or {}).items()) or "-"),
        ("output tok/s", _f(s.get("output_throughput_tok_s"), 1)),
        ("total tok/s", _f(s.get("total_throughput_tok_s"), 1)),
        ("requests/s", _f(s.get("request_throughput_req_s"), 3)),
        ("goodput req/s", _f(s.get("goodput_req_s"), 3)),
        ("accept length", f"{_f(s.get('accept_length'))} ({s.get('accept_length_source') or 'n/a'})"),
        ("cached token share", cache_text(s)),
        ("dispatch lag ms", lag_text(s)),
        *session_rows(s),
        ("duration s", _f(s.get("duration_s"), 2)),
        ("steadiness", steady_text(s)),
        ("max queue", _f(s.get("max_queued_requests"), 0)),
        ("energy", energy_text(s)),
        ("throttling", throttle_text(s)),
        ("input lengths", "exact" if s.get("input_len_exact") else
         f"APPROXIMATE ({s.get('input_len_source') or 'unknown'})"),
    ]
    for name, val in rows:
        t.add_row(name, val, *([""] * (len(cols) - 1)))
    return t


TURN_ROWS = 8  # turns shown in the table; every turn is in --json and the store


def turn_rows(s: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    """'  turn 3 (n=8, 1,200 in)' rows of TTFT median and p90 by turn index (multi-turn)."""
    rows = s.get("by_turn") or []
    out = []
    for row in rows[:TURN_ROWS]:
        tt = row.get("ttft_ms") or {}
        inp = row.get("input_tokens_median")
        name = (f"  turn {row.get('turn')} (n={row.get('completed')}"
                + (f", {inp:,.0f} tok in" if inp is not None else "") + ")")
        out.append((name, {"median": _f(tt.get("median")), "p90": _f(tt.get("p90"))}))
    if len(rows) > TURN_ROWS:
        out.append((f"  turns {rows[TURN_ROWS]['turn']}-{rows[-1]['turn']}: in --json", {}))
    return out


def session_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """Sessions finished / started, their duration and completed turns (multi-turn)."""
    if not s.get("sessions"):
        return []
    d = s.get("session_duration_s") or {}
    tc = s.get("turns_completed") or {}
    return [("sessions finished / started", f"{_f(s.get('sessions_finished'))} / {_f(s.get('sessions'))}"),
            ("session duration s", f"median {_f(d.get('median'))}, p90 {_f(d.get('p90'))}"),
            ("turns completed", f"median {_f(tc.get('median'), 1)}, min {_f(tc.get('min'))}, "
                                f"max {_f(tc.get('max'))}")]


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def cache_text(s: dict[str, Any]) -> str:
    """'42.0% (reported by 90 of 100; workload prefix share 50.0%; engine's hit rate 41.5%
    (counters))', or '-' when unreported."""
    n = s.get("cached_tokens_reported")
    ideal = s.get("prefix_share")
    tail = f"workload prefix share {_pct(ideal)}" if ideal is not None else ""
    if not n:
        return "not reported" + (f" ({tail})" if tail else "") if tail else "-"
    engine = s.get("prefix_cache_hit_rate")
    if engine is not None:
        tail += ("; " if tail else "") + (f"engine's hit rate {_pct(engine)} "
                                          f"({s.get('prefix_cache_hit_rate_source')})")
    return (f"{_pct(s.get('cached_token_share'))} (reported by {n} of {s.get('completed')}"
            + (f"; {tail}" if tail else "") + ")")


def steady_text(s: dict[str, Any]) -> str:
    """'steady: no trend from 0.5 s to 5 s (warm-up 0.5 s)', 'ABOVE SATURATION: queue grows
    ...', '-' when
    the load point has no telemetry (off, imported, measured before it existed)."""
    st = s.get("steadiness")
    if not isinstance(st, dict):
        return "-"
    status = st.get("status")
    name = "ABOVE SATURATION" if status == "above_saturation" else status
    src = " [queue: client in-flight]" if st.get("queue_source") == "client_in_flight" else ""
    return f"{name}: {st.get('reason')}{src}"


def energy_text(s: dict[str, Any]) -> str:
    """'0.412 J/output token, 2.43 tokens/J, 310 W mean', 'n/a (why)' without a GPU, '-' when
    the load point has no telemetry."""
    tel = s.get("telemetry")
    if not isinstance(tel, dict):
        return "-"
    jpt = s.get("j_per_output_token")
    if jpt is None:
        gs = tel.get("gpu_status") or ""
        return "n/a" + (f" ({gs[5:]})" if gs.startswith("n/a: ") else "") if gs != "ok" else "-"
    e = s.get("energy") or {}
    return (f"{jpt:.4g} J/output token, {_f(s.get('output_tokens_per_j'))} tokens/J, "
            f"{_f(e.get('mean_power_w'), 0)} W mean ({e.get('source')})")


def throttle_text(s: dict[str, Any]) -> str:
    """'GPU 0: sw_power_cap 40%', 'none' (GPUs sampled, no slowdown), '-' without GPU samples."""
    thr = s.get("throttle_reasons")
    if thr is None:
        return "-"
    parts = [f"GPU {g}: " + ", ".join(f"{k} {v:.0%}" for k, v in sorted(r.items()))
             for g, r in sorted(thr.items()) if r]
    return "; ".join(parts) or "none"


def lag_text(s: dict[str, Any]) -> str:
    """'median 0.41, p99 1.20, max 3.10' (open loop), '-' in a closed loop; BEHIND when the
    client fell behind its schedule."""
    lag = s.get("dispatch_lag_ms")
    if not isinstance(lag, dict):
        return "-"
    txt = f"median {_f(lag.get('median'))}, p99 {_f(lag.get('p99'))}, max {_f(lag.get('max'))}"
    return txt + ("  BEHIND SCHEDULE" if s.get("dispatch_behind") else "")


def list_table(rows: list[Any]) -> Table:
    """One line per stored load point (newest first)."""
    t = Table(title="stored load points", title_justify="left")
    for c in ("id", "when (UTC)", "source", "label", "model", "load", "done/failed", "out tok/s",
              "TTFT p50 ms", "TPOT p50 ms", "accept"):
        t.add_column(c, justify="right" if c in ("id", "out tok/s", "TTFT p50 ms", "TPOT p50 ms") else "left")
    for r in rows:
        s = r.summary
        t.add_row(str(r.id), time.strftime("%m-%d %H:%M", time.gmtime(r.created)), r.source,
                  r.label or "-", r.model or "-", r.load_key,
                  f"{_f(s.get('completed'))}/{_f(s.get('failed'))}", _f(s.get("output_throughput_tok_s"), 1),
                  _f((s.get("ttft_ms") or {}).get("median")), _f((s.get("tpot_ms") or {}).get("median")),
                  _f(s.get("accept_length")))
    return t
