"""Bring results of SGLang's `bench_serving` (JSONL, one line per run) and vLLM's
`benchmark_serving` / `vllm bench serve` (`--save-result` JSON) into the store, their field names
mapped to ours (docs/METRICS.md has the table).

Their "ITL" is the raw gap between streamed chunks, which is our `chunk_gap_ms`, not our per-token
`itl_ms` (left null: it cannot be recovered without per-chunk token counts). Their per-request
times are in seconds; ours in ms.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from servelab import provenance
from servelab.bench.metrics import STAT_KEYS
from servelab.errors import UserError

# our metric -> the name stem they use in `{stat}_{stem}_ms`
_SGLANG_STEMS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "chunk_gap_ms": "itl", "e2e_ms": "e2e_latency"}
_VLLM_STEMS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "chunk_gap_ms": "itl", "e2e_ms": "e2el"}


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def _stats(obj: dict[str, Any], stem: str) -> dict[str, float | None]:
    return {k: _num(obj.get(f"{k}_{stem}_ms")) for k in STAT_KEYS}


def _load(path: Path) -> list[dict[str, Any]]:
    # Python's json, not orjson: these tools write `Infinity`/`NaN` (json.dumps of request_rate=inf)
    text = path.read_text(errors="replace")
    try:
        obj = json.loads(text)
        objs = obj if isinstance(obj, list) else [obj]
    except json.JSONDecodeError:
        try:
            objs = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: neither JSON nor JSONL ({exc})") from None
    objs = [o for o in objs if isinstance(o, dict)]
    if not objs:
        raise UserError(f"{path}: no result object found")
    return objs


def _load_key(concurrency: Any, rate: Any) -> tuple[str, int | None, float | None]:
    c = int(concurrency) if _num(concurrency) is not None else None
    r = _num(rate) if not isinstance(rate, str) else None
    if c is not None:
        return f"c={c}", c, r
    if r is not None:
        return f"rate={r:g}", None, r
    return "rate=inf", None, None


def _records(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-request records from the detail lists, when the file has them (seconds -> ms)."""
    ttfts = obj.get("ttfts")
    if not isinstance(ttfts, list):
        return []
    n = len(ttfts)
    itls = obj.get("itls") if isinstance(obj.get("itls"), list) else []
    nested = bool(itls) and isinstance(itls[0], list)  # per request (SGLang, old vLLM) or flat
    ins = obj.get("input_lens") or [None] * n
    outs = obj.get("output_lens") or [None] * n
    lats = obj.get("latencies") or obj.get("e2e_latencies") or []
    errs = obj.get("errors") or [""] * n
    recs = []
    for i in range(n):
        gaps = [g * 1e3 for g in itls[i]] if nested and i < len(itls) else []
        err = errs[i] if i < len(errs) and len(errs) == n else ""
        ok = not err and _num(ttfts[i]) is not None and (ttfts[i] or 0) > 0
        out = outs[i] if i < len(outs) else None
        tpot = (sum(gaps) / (out - 1)) if ok and gaps and isinstance(out, int) and out > 1 else None
        recs.append({"index": i, "ok": ok, "error": (str(err)[:300] or None) if not ok else None,
                     "ttft_ms": ttfts[i] * 1e3 if ok else None, "tpot_ms": tpot,
                     "e2e_ms": lats[i] * 1e3 if ok and i < len(lats) and len(lats) == n else None,
                     "chunk_gap_ms": gaps, "input_tokens": ins[i] if i < len(ins) else None,
                     "output_tokens": out})
    return recs


def _common(obj: dict[str, Any], stems: dict[str, str]) -> dict[str, Any]:
    """The fields both tools write alike: latency stats, totals and throughputs, the failed count
    from `errors`, the grouped error messages and the load point."""
    duration = _num(obj.get("duration"))
    s: dict[str, Any] = {m: _stats(obj, stem) for m, stem in stems.items()}
    s["itl_ms"] = dict.fromkeys(STAT_KEYS)  # their ITL is per chunk: see chunk_gap_ms
    tin, tout = _num(obj.get("total_input_tokens")), _num(obj.get("total_output_tokens"))
    s.update({
        "duration_s": duration, "completed": obj.get("completed"),
        "total_input_tokens": tin, "total_output_tokens": tout,
        "output_throughput_tok_s": _num(obj.get("output_throughput")),
        "input_throughput_tok_s": _num(obj.get("input_throughput"))
        or (tin / duration if tin is not None and duration else None),
        "request_throughput_req_s": _num(obj.get("request_throughput")),
        "input_len_exact": False, "input_len_source": None,
    })
    tot = _num(obj.get("total_token_throughput")) or _num(obj.get("total_throughput"))
    if tot is None and tin is not None and tout is not None and duration:
        tot = (tin + tout) / duration
    s["total_throughput_tok_s"] = tot
    errs = [e for e in obj.get("errors") or [] if e]
    key, c, r = _load_key(obj.get("max_concurrency"), obj.get("request_rate"))
    s.update({
        "failed": len(errs) if "errors" in obj else None,
        "failure_reasons": dict(Counter(str(e).strip().splitlines()[-1][:80] for e in errs)),
        "load_key": key, "concurrency": c, "request_rate": r,
    })
    return s


def from_sglang(obj: dict[str, Any]) -> dict[str, Any]:
    """Our summary from one line of `python -m sglang.bench_serving --output-file`."""
    s = _common(obj, _SGLANG_STEMS)
    acc = _num(obj.get("accept_length"))
    s.update({
        "goodput_req_s": None, "goodput_slo": None,
        "accept_length": acc, "accept_length_source": "metrics:sglang" if acc else None,
        "accept_rate": None,
        "api": obj.get("backend"), "dataset": obj.get("dataset_name"),
        "input_len": obj.get("random_input_len"), "output_len": obj.get("random_output_len"),
        "imported_from": "sglang.bench_serving",
    })
    return s


def from_vllm(obj: dict[str, Any]) -> dict[str, Any]:
    """Our summary from a `vllm bench serve --save-result` (benchmark_serving.py) JSON."""
    s = _common(obj, _VLLM_STEMS)
    acc = _num(obj.get("spec_decode_acceptance_length"))
    rate = _num(obj.get("spec_decode_acceptance_rate"))
    if isinstance(obj.get("failed"), int):  # vLLM counts failures itself; else count `errors`
        s["failed"] = obj["failed"]
    s.update({
        "goodput_req_s": _num(obj.get("request_goodput")), "goodput_slo": None,
        "accept_length": acc, "accept_length_source": "metrics:vllm" if acc else None,
        "accept_rate": rate / 100.0 if rate is not None else None,
        "burstiness": _num(obj.get("burstiness")),
        "api": obj.get("backend") or obj.get("endpoint_type"), "model": obj.get("model_id"),
        "imported_from": "vllm.benchmark_serving",
    })
    return s


def import_file(store: Any, kind: str, path: str | Path, label: str | None = None) -> list[int]:
    """Import every result in the file as one load point each; the new row ids."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: no such file")
    conv = {"sglang": from_sglang, "vllm": from_vllm}.get(kind)
    if conv is None:
        raise UserError(f"cannot import {kind!r} results; use sglang or vllm")
    ids = []
    for i, obj in enumerate(_load(p)):
        if "duration" not in obj or "completed" not in obj:
            raise UserError(f"{p}: entry {i} has no 'duration'/'completed': not a {kind} benchmark result")
        summary = conv(obj)
        prov = provenance.collect(imported_from=str(p.resolve()), import_kind=kind,
                                  original_date=obj.get("date"), original_model=obj.get("model_id"))
        ids.append(store.add_load_point(
            summary=summary, provenance=prov, load_key=summary["load_key"], source=f"import:{kind}",
            label=label or p.name, model=obj.get("model_id") or obj.get("model"),
            concurrency=summary["concurrency"], request_rate=summary["request_rate"],
            requests=_records(obj) or None,
        ))
    return ids
