"""GuideLLM's `benchmarks.json` (0.8: `guidellm run --output kind=json`): one load point per
benchmark (a sweep writes several), every distribution it keeps, and per-request records.

Names (docs/METRICS.md): their `inter_token_latency_ms` is (E2E - TTFT) / (n - 1), our
`tpot_ms`; their `time_per_output_token_ms` is E2E / n (TTFT included), which we keep as
`e2e_per_token_ms` and never call TPOT; `request_latency` is in seconds. A distribution is
{mean, median, std_dev, min, max, count, percentiles {p001 ... p999}}: p001 is the 0.1th
percentile, p01 the 1st, p999 the 99.9th; every one is kept (`ttft_ms.p0.1`, `ttft_ms.p5`...).
Statistics are of successful requests, as ours are of completed ones.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

from servelab.bench.importers.common import (
    Bad,
    Entry,
    at,
    count,
    num,
    protocol_of,
    reason,
    scaled,
    show,
    sub,
    text,
)
from servelab.bench.metrics import STAT_KEYS

_PCT = {"p001": "p0.1", "p01": "p1", "p05": "p5", "p10": "p10", "p25": "p25", "p50": "p50",
        "p75": "p75", "p90": "p90", "p95": "p95", "p99": "p99", "p999": "p99.9"}
# our latency object <- their metric (factor to ms)
_LATENCIES = {"ttft_ms": ("time_to_first_token_ms", 1.0),
              "tpot_ms": ("inter_token_latency_ms", 1.0),
              "e2e_ms": ("request_latency", 1e3),
              "e2e_per_token_ms": ("time_per_output_token_ms", 1.0)}


def distribution(d: dict[str, Any] | None) -> dict[str, float | None]:
    """Our latency object from one of their distributions (None values when absent)."""
    if d is None:
        return dict.fromkeys(STAT_KEYS)
    out: dict[str, float | None] = {"mean": num(d, "mean"), "median": num(d, "median"),
                                    "std": num(d, "std_dev"), "min": num(d, "min"),
                                    "max": num(d, "max")}
    pct = sub(d, "percentiles") or {}
    for theirs, ours in _PCT.items():
        out[ours] = num(pct, theirs)
    for k in ("p90", "p95", "p99"):
        out.setdefault(k, None)
    return out


def _successful(metrics: dict[str, Any], name: str) -> dict[str, Any] | None:
    m = sub(metrics, name)
    return None if m is None else sub(m, "successful")


def _load(cfg: dict[str, Any]) -> tuple[str, int | None, float | None]:
    """Our load key from their strategy: concurrent/synchronous are closed loops, constant and
    poisson open loops at `rate`, throughput everything at once."""
    kind = text(cfg, "type_")
    if kind == "synchronous":
        return "c=1", 1, None
    if kind == "concurrent":
        c = count(cfg, "streams", required=True)
        return f"c={c}", c, None
    if kind in ("constant", "poisson", "async"):
        r = num(cfg, "rate")
        if r is not None and r > 0:
            return f"rate={r:g}", None, r
    if kind == "throughput":
        return "rate=inf", None, None
    raise Bad(f"strategy type {show(kind)} is not one of synchronous, concurrent, constant, "
              "poisson, throughput")


def _records(reqs: dict[str, Any], t0: float | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for status in ("successful", "errored", "incomplete"):
        rows = reqs.get(status) or []
        if not isinstance(rows, list):
            raise Bad(f"'requests.{status}' must be a list, got {show(rows)}")
        for i, r in enumerate(rows):
            if not isinstance(r, dict):
                raise Bad(f"'requests.{status}[{i}]' must be an object, got {show(r)}")
            with at(f"requests.{status}[{i}]"):
                ok = status == "successful"
                info = sub(r, "info") or {}
                err = text(info, "error") if not ok else None
                lat = num(r, "request_latency")
                start = num(r, "request_start_time")
                out.append({
                    "index": len(out), "ok": ok,
                    "error": None if ok else ("incomplete" if status == "incomplete"
                                              else reason(err or "unknown error")),
                    "error_detail": (err or "")[:300] or None,
                    "ttft_ms": num(r, "time_to_first_token_ms") if ok else None,
                    "tpot_ms": num(r, "inter_token_latency_ms") if ok else None,
                    "e2e_ms": lat * 1e3 if ok and lat is not None else None,
                    "input_tokens": count(r, "prompt_tokens"),
                    "output_tokens": count(r, "output_tokens"),
                    "start_s": start - t0 if start is not None and t0 is not None else None,
                })
    return out


def _benchmark(b: dict[str, Any], backend: dict[str, Any]) -> Entry:
    metrics = sub(b, "metrics")
    if metrics is None:
        raise Bad("has no 'metrics': not a GuideLLM generative benchmark")
    duration = num(b, "duration")
    if duration is None or duration <= 0:
        raise Bad(f"'duration' must be a positive number of seconds, got {show(b.get('duration'))}")
    with at("config.strategy"):
        key, c, r = _load(sub(sub(b, "config") or {}, "strategy") or {})
    s: dict[str, Any] = {}
    with at("metrics"):
        for ours, (theirs, f) in _LATENCIES.items():
            with at(theirs):
                s[ours] = scaled(distribution(_successful(metrics, theirs)), f)
        totals = sub(metrics, "request_totals") or {}
        with at("request_totals"):
            completed = count(totals, "successful", required=True)
            errored, incomplete = count(totals, "errored"), count(totals, "incomplete")
        tin = _successful(metrics, "prompt_token_count")
        tout = _successful(metrics, "output_token_count")
        conc = _successful(metrics, "request_concurrency")
        tin_sum = num(tin, "total_sum") if tin else None
        tout_sum = num(tout, "total_sum") if tout else None
    s["itl_ms"] = dict.fromkeys(STAT_KEYS)  # per-token gaps: they keep none per chunk
    s["chunk_gap_ms"] = dict.fromkeys(STAT_KEYS)
    errs = [sub(e, "info") or {} for e in (sub(b, "requests") or {}).get("errored") or []
            if isinstance(e, dict)]
    reasons = Counter(reason(text(i, "error") or "unknown error") for i in errs)
    if incomplete:
        reasons["incomplete"] = incomplete
    tin_n = round(tin_sum) if tin_sum is not None else None
    tout_n = round(tout_sum) if tout_sum is not None else None
    s.update({
        "duration_s": duration, "completed": completed,
        "failed": (errored or 0) + (incomplete or 0) if errored is not None else None,
        "failure_reasons": dict(reasons),
        "total_input_tokens": tin_n, "total_output_tokens": tout_n,
        "output_throughput_tok_s": tout_n / duration if tout_n is not None else None,
        "input_throughput_tok_s": tin_n / duration if tin_n is not None else None,
        "total_throughput_tok_s": (tin_n + tout_n) / duration
        if tin_n is not None and tout_n is not None else None,
        "request_throughput_req_s": completed / duration,
        "measured_concurrency": num(conc, "mean") if conc else None,
        "goodput_req_s": None, "goodput_slo": None,
        "load_key": key, "concurrency": c, "request_rate": r,
        "warmup_s": num(b, "warmup_duration"), "cooldown_s": num(b, "cooldown_duration"),
        "input_len_exact": False, "input_len_source": None,
        "accept_length": None, "accept_length_source": None, "accept_rate": None,
        "api": text(backend, "request_format") or text(backend, "kind"),
        "imported_from": "guidellm",
    })
    s["protocol"] = protocol_of(s["api"])
    t0 = num(b, "start_time")
    reqs = sub(b, "requests") or {}
    date = dt.datetime.fromtimestamp(t0, dt.UTC).isoformat(timespec="seconds") if t0 else None
    return Entry(s, _records(reqs, t0), text(backend, "model"), date)


def parse(doc: Any, path: Path) -> list[Entry]:
    """One Entry per benchmark of a GuideLLM benchmarks.json."""
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise Bad("expected an object with a 'benchmarks' list (GuideLLM's benchmarks.json)")
    meta = sub(doc, "metadata") or {}
    version = text(meta, "guidellm_version")
    spec = sub(sub(doc, "config") or {}, "spec") or {}
    backend = sub(spec, "backend") or {}
    out = []
    bs = doc["benchmarks"]
    for i, b in enumerate(bs):
        if not isinstance(b, dict):
            raise Bad(f"benchmarks[{i}] must be an object, got {show(b)}")
        with at(f"benchmark {i + 1} of {len(bs)}"):
            e = _benchmark(b, sub(sub(b, "config") or {}, "backend") or backend)
        e.summary["imported_version"] = version
        out.append(e)
    return out
