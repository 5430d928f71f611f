"""LLMPerf's (ray-project/llmperf `token_benchmark_ray.py`) `<name>_summary.json`, with
`<name>_individual_responses.json` beside it when present.

Names (docs/METRICS.md): times are in seconds. Their `inter_token_latency_s` is NOT our TPOT:
per request it is (TTFT + the gaps between content chunks) / output tokens, about E2E / n with
the TTFT inside, so it is kept as `e2e_per_token_ms`. Our `tpot_ms`, (E2E - TTFT) / (n - 1),
is computed per request from the individual responses when they are there (and its statistics
by bench/metrics.stats, the one definition), else left null. The file has no duration: their
`results_num_completed_requests_per_min` is completed / (end - start) x 60, so the duration is
completed x 60 / that. Quantile keys `results_X_quantiles_pN`, plus mean, min, max, stddev.
"""

from __future__ import annotations

import ast
import datetime as dt
from pathlib import Path
from typing import Any

from servelab.bench.importers.common import (
    Bad,
    Entry,
    at,
    count,
    num,
    read_json,
    reason,
    show,
    text,
)
from servelab.bench.metrics import STAT_KEYS, stats

SUFFIX = "_summary.json"
RESPONSES = "_individual_responses.json"
_LATENCIES = {"ttft_ms": "ttft_s", "e2e_ms": "end_to_end_latency_s",
              "e2e_per_token_ms": "inter_token_latency_s"}


def _stat(doc: dict[str, Any], stem: str, factor: float = 1e3) -> dict[str, float | None]:
    """Our latency object from `results_{stem}_{mean,min,max,stddev,quantiles_pN}`."""
    pre = f"results_{stem}_"
    out: dict[str, float | None] = {"mean": num(doc, pre + "mean"), "std": num(doc, pre + "stddev")}
    for k in ("min", "max"):  # LLMPerf writes some of these as strings ("550")
        v = doc.get(pre + k)
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                raise Bad(f"'{pre + k}' must be a number, got {show(v)}") from None
        out[k] = num({k: v}, k) if v is not None else None
    for key in doc:
        if key.startswith(pre + "quantiles_p"):
            out[key[len(pre + "quantiles_"):]] = num(doc, key)
    out["median"] = out.get("p50")
    for k in ("p90", "p95", "p99"):
        out.setdefault(k, None)
    return {k: (v * factor if v is not None else None) for k, v in out.items()}


def _records(rows: Any) -> list[dict[str, Any]]:
    if not isinstance(rows, list):
        raise Bad(f"individual responses must be a list, got {show(rows)}")
    out = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise Bad(f"response {i + 1} must be an object, got {show(r)}")
        with at(f"response {i + 1}"):
            code = r.get("error_code")
            ok = code is None
            ttft, e2e = num(r, "ttft_s"), num(r, "end_to_end_latency_s")
            n = count(r, "number_output_tokens")
            tpot = ((e2e - ttft) * 1e3 / (n - 1) if ok and ttft is not None and e2e is not None
                    and n is not None and n > 1 else None)
            out.append({
                "index": i, "ok": ok,
                "error": None if ok else (f"http_{code}" if isinstance(code, int) and code > 0
                                          else reason(text(r, "error_msg") or "error")),
                "error_detail": None if ok else (text(r, "error_msg") or "")[:300],
                "http_status": code if isinstance(code, int) and code > 0 else None,
                "ttft_ms": ttft * 1e3 if ok and ttft is not None else None,
                "e2e_ms": e2e * 1e3 if ok and e2e is not None else None,
                "tpot_ms": tpot, "input_tokens": count(r, "number_input_tokens"),
                "output_tokens": n,
            })
    return out


def _failures(doc: dict[str, Any]) -> dict[str, int]:
    v = doc.get("results_error_code_frequency")
    if isinstance(v, str):  # LLMPerf writes it as the str() of a dict: "{}", "{429: 3}"
        try:
            v = ast.literal_eval(v) if v.strip() else {}  # literals only: no code runs
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise Bad(f"'results_error_code_frequency' is not a mapping: {show(v)}") from None
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(isinstance(n, int) for n in v.values()):
        raise Bad(f"'results_error_code_frequency' must map codes to counts, got {show(v)}")
    return {f"http_{k}": n for k, n in v.items()}


def read(path: Path) -> tuple[list[Entry], bytes]:
    """One load point from a summary file (and its individual responses beside it)."""
    doc, data = read_json(path)
    if not isinstance(doc, dict) or "results_num_completed_requests" not in doc:
        raise Bad("expected LLMPerf's *_summary.json (no 'results_num_completed_requests')")
    s: dict[str, Any] = {k: _stat(doc, v) for k, v in _LATENCIES.items()}
    s["itl_ms"] = dict.fromkeys(STAT_KEYS)
    s["chunk_gap_ms"] = dict.fromkeys(STAT_KEYS)
    for ours, stem in (("input_len_stats", "number_input_tokens"),
                       ("output_len_stats", "number_output_tokens"),
                       ("request_output_tok_s_stats", "request_output_throughput_token_per_s")):
        s[ours] = _stat(doc, stem, factor=1.0)
    completed = count(doc, "results_num_completed_requests", required=True)
    per_min = num(doc, "results_num_completed_requests_per_min")
    if not per_min or not completed:
        raise Bad("'results_num_completed_requests_per_min' must be positive: the duration is "
                  "derived from it")
    dur = completed * 60.0 / per_min
    c = count(doc, "num_concurrent_requests")
    records: list[dict[str, Any]] = []
    side = path.with_name(path.name[:-len(SUFFIX)] + RESPONSES) if path.name.endswith(
        SUFFIX) else None
    if side is not None and side.is_file():
        rows, extra = read_json(side)
        with at(side.name):
            records = _records(rows)
        data += extra
    ok = [r for r in records if r["ok"]]
    tpots = [r["tpot_ms"] for r in ok if r["tpot_ms"] is not None]
    s["tpot_ms"] = stats(tpots) if tpots else dict.fromkeys(STAT_KEYS)
    tin_mean = num(doc, "results_number_input_tokens_mean")
    tout_mean = num(doc, "results_number_output_tokens_mean")
    tin = sum(r["input_tokens"] or 0 for r in ok) if ok else (
        round(tin_mean * completed) if tin_mean is not None else None)
    tout = sum(r["output_tokens"] or 0 for r in ok) if ok else (
        round(tout_mean * completed) if tout_mean is not None else None)
    ts = num(doc, "timestamp")
    s.update({
        "duration_s": dur, "completed": completed, "failed": count(doc, "results_number_errors"),
        "failure_reasons": _failures(doc), "total_input_tokens": tin, "total_output_tokens": tout,
        "output_throughput_tok_s": num(doc, "results_mean_output_throughput_token_per_s"),
        "input_throughput_tok_s": tin / dur if tin is not None else None,
        "total_throughput_tok_s": (tin + tout) / dur if tin is not None and tout is not None
        else None,
        "request_throughput_req_s": completed / dur,
        "goodput_req_s": None, "goodput_slo": None,
        "load_key": f"c={c}" if c else "rate=inf", "concurrency": c, "request_rate": None,
        "input_len_exact": False, "input_len_source": None,
        "accept_length": None, "accept_length_source": None, "accept_rate": None,
        "api": None, "protocol": None, "imported_from": "llmperf",
        "imported_version": text(doc, "version"),
    })
    date = dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds") if ts else None
    return [Entry(s, records, text(doc, "model"), date)], data
