"""AIPerf's `profile_export_aiperf.json` (with the per-request `profile_export.jsonl` beside it
when present) and genai-perf's `profile_export_genai_perf.json`: AIPerf grew out of genai-perf
and kept its layout, one object per metric, `{unit, avg, min, max, std, p1 ... p99}`.

Names (docs/METRICS.md): their `inter_token_latency` is per request (E2E - TTFT) / (n - 1),
our `tpot_ms`; AIPerf's `inter_chunk_latency` is the gap between streamed chunks, our
`chunk_gap_ms`; `request_latency` is E2E. AIPerf's `request_count` counts successful requests
(our `completed`), `error_request_count` failed ones. Units are read from each metric's `unit`
(ms, sec, ns), never assumed.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from servelab.bench.importers.common import (
    MAX_FILE_BYTES,
    Bad,
    Entry,
    at,
    count,
    num,
    protocol_of,
    read_json,
    show,
    sub,
    text,
)
from servelab.bench.metrics import STAT_KEYS
from servelab.errors import UserError

_TO_MS = {"ms": 1.0, "sec": 1e3, "s": 1e3, "seconds": 1e3, "ns": 1e-6, "us": 1e-3}
_LATENCIES = {"ttft_ms": "time_to_first_token", "tpot_ms": "inter_token_latency",
              "e2e_ms": "request_latency", "chunk_gap_ms": "inter_chunk_latency",
              "ttst_ms": "time_to_second_token"}
JSONL = "profile_export.jsonl"


def _factor(unit: Any, name: str) -> float:
    f = _TO_MS.get(unit) if isinstance(unit, str) else None
    if f is None:
        raise Bad(f"'{name}.unit' must be a time unit ({', '.join(_TO_MS)}), got {show(unit)}")
    return f


def latency(doc: dict[str, Any], name: str) -> dict[str, float | None]:
    """Our latency object (ms) from one metric object; every percentile they wrote is kept."""
    m = sub(doc, name)
    if m is None:
        return dict.fromkeys(STAT_KEYS)
    with at(name):
        f = _factor(m.get("unit"), name)
        out: dict[str, float | None] = {"mean": num(m, "avg"), "median": num(m, "p50"),
                                        "std": num(m, "std"), "min": num(m, "min"),
                                        "max": num(m, "max")}
        for k in m:
            if k.startswith("p") and k[1:].replace(".", "", 1).isdigit():
                out[k] = num(m, k)
    for k in ("p90", "p95", "p99"):
        out.setdefault(k, None)
    return {k: (v * f if v is not None else None) for k, v in out.items()}


def scalar(doc: dict[str, Any], name: str) -> float | None:
    """The `avg` of a one-number metric (throughputs, counts, durations)."""
    m = sub(doc, name)
    if m is None:
        return None
    with at(name):
        return num(m, "avg")


def _whole(x: float | None, name: str) -> int | None:
    if x is None:
        return None
    if not float(x).is_integer():
        raise Bad(f"'{name}.avg' must be a whole number, got {show(x)}")
    return int(x)


def _common(doc: dict[str, Any], tool: str) -> dict[str, Any]:
    s: dict[str, Any] = {k: latency(doc, v) for k, v in _LATENCIES.items()}
    s["itl_ms"] = dict.fromkeys(STAT_KEYS)  # their per-request mean is our TPOT; no per-token list
    completed = _whole(scalar(doc, "request_count"), "request_count")
    rps = scalar(doc, "request_throughput")
    dur = scalar(doc, "benchmark_duration")
    if dur is not None:
        dur *= _factor((sub(doc, "benchmark_duration") or {}).get("unit"), "benchmark_duration") / 1e3
    elif completed is not None and rps:
        dur = completed / rps  # genai-perf writes no duration: its throughput is count / duration
    tin = _whole(scalar(doc, "total_isl"), "total_isl")
    tout = _whole(scalar(doc, "total_osl") or scalar(doc, "total_output_tokens"), "total_osl")
    s.update({
        "duration_s": dur, "completed": completed,
        "failed": _whole(scalar(doc, "error_request_count"), "error_request_count"),
        "total_input_tokens": tin, "total_output_tokens": tout,
        "output_throughput_tok_s": scalar(doc, "output_token_throughput"),
        "input_throughput_tok_s": scalar(doc, "input_token_throughput"),
        "total_throughput_tok_s": scalar(doc, "total_token_throughput"),
        "request_throughput_req_s": rps,
        "goodput_req_s": scalar(doc, "request_goodput") or scalar(doc, "goodput"),
        "goodput_slo": None,
        "input_len_exact": False, "input_len_source": None,
        "accept_length": None, "accept_length_source": None, "accept_rate": None,
        "imported_from": tool,
    })
    return s


def _failures(doc: dict[str, Any]) -> dict[str, int]:
    v = doc.get("error_summary") or []
    if not isinstance(v, list):
        raise Bad(f"'error_summary' must be a list, got {show(v)}")
    out: Counter[str] = Counter()
    for i, e in enumerate(v):
        if not isinstance(e, dict):
            raise Bad(f"'error_summary'[{i}] must be an object, got {show(e)}")
        with at(f"error_summary[{i}]"):
            d = sub(e, "error_details") or {}
            code = d.get("code")
            key = f"http_{code}" if isinstance(code, int) else (text(d, "type") or "error")
            out[key] += count(e, "count", required=True) or 0
    return dict(out)


def _aiperf_load(cfg: dict[str, Any]) -> tuple[str, int | None, float | None]:
    phases = [p for p in cfg.get("phases") or [] if isinstance(p, dict)
              and p.get("kind", "profiling") == "profiling"]
    p = phases[0] if phases else {}
    c, r = count(p, "concurrency"), num(p, "rate")
    if r:
        return f"rate={r:g}", c, r
    if c:
        return f"c={c}", c, None
    return "rate=inf", None, None


def _records(path: Path) -> tuple[list[dict[str, Any]], bytes]:
    """Per-request records of profile_export.jsonl (profiling phase only)."""
    if path.stat().st_size > MAX_FILE_BYTES:
        raise UserError(f"{path}: larger than any benchmark result")
    data = path.read_bytes()
    rows, t0 = [], None
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise Bad(f"{path.name} line {n} is not JSON") from None
        if not isinstance(obj, dict):
            raise Bad(f"{path.name} line {n} must be an object")
        with at(f"{path.name} line {n}"):
            meta, m = sub(obj, "metadata") or {}, sub(obj, "metrics") or {}
            if text(meta, "benchmark_phase") not in (None, "profiling"):
                continue
            start = meta.get("request_start_ns")
            if start is not None and (isinstance(start, bool) or not isinstance(start, int)
                                      or start < 0):
                raise Bad(f"'request_start_ns' must be a whole number >= 0, got {show(start)}")
            t0 = start if t0 is None or (start is not None and start < t0) else t0
            rows.append((n, obj, m, start))
    out = []
    for i, (n, obj, m, start) in enumerate(rows):
        with at(f"{path.name} line {n}"):
            err = sub(obj, "error")
            vals = {k: _value(m, _LATENCIES[k]) for k in ("ttft_ms", "tpot_ms", "e2e_ms")}
            gaps = _value(m, "inter_chunk_latency", many=True)
            out.append({
                "index": i, "ok": err is None,
                "error": None if err is None else (f"http_{err['code']}" if isinstance(
                    err.get("code"), int) else "error"),
                "error_detail": None if err is None else (text(err, "message") or "")[:300],
                "http_status": err.get("code") if err and isinstance(err.get("code"), int) else None,
                "ttft_ms": vals["ttft_ms"], "tpot_ms": vals["tpot_ms"], "e2e_ms": vals["e2e_ms"],
                "chunk_gap_ms": gaps or [],
                "input_tokens": _count_value(m, "input_sequence_length"),
                "output_tokens": _count_value(m, "output_sequence_length"),
                "start_s": (start - t0) / 1e9 if start is not None and t0 is not None else None,
            })
    return out, data


def _value(m: dict[str, Any], name: str, many: bool = False) -> Any:
    v = sub(m, name)
    if v is None:
        return None
    with at(name):
        f = _factor(v.get("unit"), name)
        x = v.get("value")
        if many:
            if not isinstance(x, list):
                raise Bad(f"'value' must be a list, got {show(x)}")
            return [num({"v": y}, "v") * f for y in x]  # type: ignore[operator]
        y = num(v, "value")
        return y * f if y is not None else None


def _count_value(m: dict[str, Any], name: str) -> int | None:
    v = sub(m, name)
    return None if v is None else count(v, "value")


def read_aiperf(path: Path) -> tuple[list[Entry], bytes]:
    """AIPerf's profile_export_aiperf.json, with profile_export.jsonl beside it when there."""
    doc, data = read_json(path)
    if not isinstance(doc, dict) or "aiperf_version" not in doc:
        raise Bad("expected AIPerf's profile_export_aiperf.json (no 'aiperf_version')")
    with at("input_config"):
        cfg = sub(doc, "input_config") or {}
        key, c, r = _aiperf_load(cfg)
        ep = sub(cfg, "endpoint") or {}
        models = (sub(cfg, "models") or {}).get("items") or [{}]
        model = text(models[0], "name") if isinstance(models[0], dict) else None
    s = _common(doc, "aiperf")
    if s["duration_s"] is None or s["duration_s"] <= 0:
        raise Bad("'benchmark_duration' must be a positive number of seconds")
    reasons = _failures(doc)
    if s["failed"] is None and isinstance(doc.get("error_summary"), list):
        s["failed"] = sum(reasons.values())  # no error count written when there were none
    s.update({"failure_reasons": reasons, "load_key": key, "concurrency": c,
              "request_rate": r, "api": text(ep, "type"),
              "imported_version": text(doc, "aiperf_version")})
    s["protocol"] = protocol_of(s["api"])
    records: list[dict[str, Any]] = []
    side = path.with_name(JSONL)
    if side.is_file():
        records, extra = _records(side)
        data += extra  # the import is of both files: either changing makes it a new one
    return [Entry(s, records, model, text(doc, "start_time"))], data


def parse_genai_perf(doc: Any, path: Path) -> list[Entry]:
    """genai-perf's profile_export_genai_perf.json (its `input_config` is its arguments)."""
    if not isinstance(doc, dict) or "time_to_first_token" not in doc and "request_latency" not in doc:
        raise Bad("expected genai-perf's profile_export_genai_perf.json (no "
                  "'request_latency'/'time_to_first_token')")
    cfg = sub(doc, "input_config") or {}
    s = _common(doc, "genai-perf")
    with at("input_config"):
        # 0.0.16: {model_names, endpoint: {type}, perf_analyzer: {stimulus: {concurrency | request_rate}}};
        # earlier: its argparse namespace {model: [...], endpoint_type, concurrency, request_rate}
        stim = sub(sub(cfg, "perf_analyzer") or {}, "stimulus") or cfg
        c = count(stim, "concurrency")
        r = num(stim, "request_rate")
        names = cfg.get("model_names") or cfg.get("model") or []
        if isinstance(names, str):
            names = [names]
        model = names[0] if isinstance(names, list) and names and isinstance(names[0], str) \
            else None
        api = text(sub(cfg, "endpoint") or {}, "type") or text(cfg, "endpoint_type")
    key = f"rate={r:g}" if r else f"c={c}" if c else "rate=inf"
    s.update({"failure_reasons": {}, "load_key": key, "concurrency": c, "request_rate": r or None,
              "api": api, "protocol": protocol_of(api)})
    return [Entry(s, [], model, None)]
