"""Results of SGLang's `bench_serving` (JSONL, one line per run) and vLLM's
`benchmark_serving` / `vllm bench serve` (`--save-result` JSON) into the store, their field names
mapped to ours (docs/METRICS.md has the table).

Their "ITL" is the raw gap between streamed chunks, which is our `chunk_gap_ms`, not our per-token
`itl_ms` (left null: it cannot be recovered without per-chunk token counts). Their per-request
times are in seconds; ours in ms. Every statistic the file holds is kept: every percentile they
wrote (`p95_ttft_ms` as `ttft_ms.p95`), goodput and its SLOs, measured and peak concurrency,
the server's arguments (SGLang's `server_info`, into provenance where secrets are redacted).

A file is JSONL (SGLang, one line per run) or one JSON object or list (vLLM).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

from servelab.bench.importers.common import Bad as _Bad
from servelab.bench.importers.common import Entry, protocol_of
from servelab.bench.importers.common import count as _count
from servelab.bench.importers.common import num as _num
from servelab.bench.importers.common import ok_num as _ok_num
from servelab.bench.importers.common import reason as _reason
from servelab.bench.importers.common import show as _show
from servelab.bench.importers.common import text as _text
from servelab.bench.metrics import STAT_KEYS

# our metric -> the name stem they use in `{stat}_{stem}_ms`
_SGLANG_STEMS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "chunk_gap_ms": "itl", "e2e_ms": "e2e_latency"}
_VLLM_STEMS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "chunk_gap_ms": "itl", "e2e_ms": "e2el"}
def _stats(obj: dict[str, Any], stem: str) -> dict[str, float | None]:
    """mean/median/std and every `p{N}` percentile they wrote for one metric."""
    out: dict[str, float | None] = {k: _num(obj, f"{k}_{stem}_ms") for k in STAT_KEYS}
    pat = re.compile(rf"p(\d+(?:\.\d+)?)_{re.escape(stem)}_ms")
    for key in obj:
        m = pat.fullmatch(key)
        if m and f"p{m.group(1)}" not in out:
            out[f"p{m.group(1)}"] = _num(obj, key)
    return out


def _seconds_list(obj: dict[str, Any], key: str, n: int | None, nested: bool = False) -> list | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, list):
        raise _Bad(f"'{key}' must be a list, got {_show(v)}")
    if n is not None and len(v) != n:
        raise _Bad(f"'{key}' has {len(v)} entries, 'ttfts' has {n}: the per-request lists "
                   "must have one entry per request")
    for i, x in enumerate(v):  # null: not measured (servelab's --save-result writes it)
        good = (isinstance(x, list) and all(_ok_num(y) for y in x)) if nested and isinstance(
            x, list) else (x is None or _ok_num(x))
        if not good:
            raise _Bad(f"'{key}'[{i}] must be a non-negative number"
                       f"{' or a list of them' if nested else ''}, got {_show(x)}")
    return v


def _int_list(obj: dict[str, Any], key: str, n: int | None) -> list[int] | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or (n is not None and len(v) != n):
        raise _Bad(f"'{key}' must be a list with one whole number per request, got {_show(v)}")
    for i, x in enumerate(v):
        if x is not None and (isinstance(x, bool) or not isinstance(x, int) or x < 0):
            raise _Bad(f"'{key}'[{i}] must be a whole number >= 0, got {_show(x)}")
    return v


def _errors(obj: dict[str, Any]) -> list[str] | None:
    v = obj.get("errors")
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(e, str) or e is None for e in v):
        raise _Bad(f"'errors' must be a list of strings, got {_show(v)}")
    return [e or "" for e in v]


def _records(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-request records from the detail lists, when the file has them (seconds -> ms)."""
    ttfts = _seconds_list(obj, "ttfts", None)
    if ttfts is None:
        return []
    n = len(ttfts)
    itls = _seconds_list(obj, "itls", None, nested=True) or []
    nested = bool(itls) and isinstance(itls[0], list)  # per request (SGLang, old vLLM) or flat
    if nested and len(itls) != n:
        raise _Bad(f"'itls' has {len(itls)} entries, 'ttfts' has {n}")
    ins = _int_list(obj, "input_lens", n) or [None] * n
    outs = _int_list(obj, "output_lens", n) or [None] * n
    lats = (_seconds_list(obj, "latencies", n) or _seconds_list(obj, "e2e_latencies", n)
            or [None] * n)
    errs = _errors(obj) or [""] * n
    if len(errs) != n:
        raise _Bad(f"'errors' has {len(errs)} entries, 'ttfts' has {n}")
    recs = []
    for i in range(n):
        gaps = [g * 1e3 for g in itls[i]] if nested else []
        ok = not errs[i] and ttfts[i] is not None and ttfts[i] > 0
        out = outs[i]
        tpot = (sum(gaps) / (out - 1)) if ok and gaps and isinstance(out, int) and out > 1 else None
        recs.append({"index": i, "ok": ok,
                     "error": (errs[i][:300] or "unknown error") if not ok else None,
                     "ttft_ms": ttfts[i] * 1e3 if ok else None, "tpot_ms": tpot,
                     "e2e_ms": lats[i] * 1e3 if ok and lats[i] is not None else None,
                     "chunk_gap_ms": gaps, "input_tokens": ins[i], "output_tokens": out})
    return recs


def _load_key(obj: dict[str, Any]) -> tuple[str, int | None, float | None]:
    c = _count(obj, "max_concurrency")
    rate = obj.get("request_rate")
    r = None if isinstance(rate, str) or (isinstance(rate, float) and math.isinf(rate)) else \
        _num(obj, "request_rate")
    if c is not None:
        return f"c={c}", c, r
    if r is not None:
        return f"rate={r:g}", None, r
    return "rate=inf", None, None


def _slos(obj: dict[str, Any]) -> dict[str, float] | None:
    """SGLang's `goodput_slos_ms` ({ttft, tpot, e2el} in ms) as our `goodput_slo` keys."""
    v = obj.get("goodput_slos_ms", obj.get("goodput"))
    if v is None:
        return None
    names = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms", "e2e": "e2e_ms"}
    if not isinstance(v, dict) or not all(k in names for k in v):
        raise _Bad(f"'goodput_slos_ms' must map ttft/tpot/e2el to milliseconds, got {_show(v)}")
    return {names[k]: _num(v, k) for k in v}


def _common(obj: dict[str, Any], stems: dict[str, str]) -> dict[str, Any]:
    """The fields both tools write alike: latency stats, totals and throughputs, failures,
    goodput, concurrency and the load point."""
    duration = _num(obj, "duration")
    if duration is None or duration <= 0:
        raise _Bad(f"'duration' must be a positive number of seconds, got {_show(obj.get('duration'))}")
    completed = _count(obj, "completed", required=True)
    s: dict[str, Any] = {m: _stats(obj, stem) for m, stem in stems.items()}
    s["itl_ms"] = dict.fromkeys(STAT_KEYS)  # their ITL is per chunk: see chunk_gap_ms
    tin = _count(obj, "total_input_tokens") if obj.get("total_input_tokens") is not None else \
        _count(obj, "total_input")
    tout = _count(obj, "total_output_tokens") if obj.get("total_output_tokens") is not None else \
        _count(obj, "total_output")
    s.update({
        "duration_s": duration, "completed": completed,
        "total_input_tokens": tin, "total_output_tokens": tout,
        "output_throughput_tok_s": _num(obj, "output_throughput"),
        "input_throughput_tok_s": _num(obj, "input_throughput")
        or (tin / duration if tin is not None else None),
        "request_throughput_req_s": _num(obj, "request_throughput"),
        "peak_output_throughput_tok_s": _num(obj, "max_output_tokens_per_s"),
        "measured_concurrency": _num(obj, "concurrency"),
        "peak_concurrency": _num(obj, "max_concurrent_requests"),
        "goodput_req_s": _num(obj, "request_goodput"),
        "goodput_slo": _slos(obj),
        "slo_attainment": _num(obj, "slo_attainment", hi=1.0),
        "input_len_exact": False, "input_len_source": None,
    })
    tot = _num(obj, "total_token_throughput")
    tot = tot if tot is not None else _num(obj, "total_throughput")
    if tot is None and tin is not None and tout is not None:
        tot = (tin + tout) / duration
    s["total_throughput_tok_s"] = tot
    errs = _errors(obj)
    failed = _count(obj, "failed")
    bad = [e for e in errs or [] if e]
    if failed is None and errs is not None:
        failed = len(bad)
    s.update({
        "failed": failed,  # None when the file says nothing about failures: unknown, not 0
        "failure_reasons": dict(Counter(_reason(e) for e in bad)),
    })
    key, c, r = _load_key(obj)
    s.update({"load_key": key, "concurrency": c, "request_rate": r})
    return s


def from_sglang(obj: dict[str, Any]) -> dict[str, Any]:
    """Our summary from one line of `python -m sglang.bench_serving --output-file`."""
    s = _common(obj, _SGLANG_STEMS)
    acc = _num(obj, "accept_length")
    s.update({
        "accept_length": acc, "accept_length_source": "metrics:sglang" if acc else None,
        "accept_rate": None,
        "api": _text(obj, "backend"), "dataset": _text(obj, "dataset_name"),
        "input_len": _count(obj, "random_input_len"), "output_len": _count(obj, "random_output_len"),
        "imported_from": "sglang.bench_serving",
    })
    s["protocol"] = protocol_of(s["api"])
    return s


def from_vllm(obj: dict[str, Any]) -> dict[str, Any]:
    """Our summary from a `vllm bench serve --save-result` (benchmark_serving.py) JSON."""
    s = _common(obj, _VLLM_STEMS)
    acc = _num(obj, "spec_decode_acceptance_length")
    rate = _num(obj, "spec_decode_acceptance_rate", hi=100.0)
    s.update({
        "accept_length": acc, "accept_length_source": "metrics:vllm" if acc else None,
        "accept_rate": rate / 100.0 if rate is not None else None,
        "burstiness": _num(obj, "burstiness"),
        "api": _text(obj, "backend") or _text(obj, "endpoint_type"),
        "model": _text(obj, "model_id"),
        "num_prompts": _count(obj, "num_prompts"),
        "imported_from": "vllm.benchmark_serving",
    })
    s["protocol"] = protocol_of(s["api"])
    return s



def parse(kind: str, objs: list[dict[str, Any]]) -> list[Entry]:
    """One Entry per result object of an SGLang or vLLM file."""
    conv = from_sglang if kind == "sglang" else from_vllm
    out = []
    for i, obj in enumerate(objs):
        try:
            if "duration" not in obj or "completed" not in obj:
                raise _Bad(f"has no 'duration'/'completed': not a {kind} benchmark result")
            summary = conv(obj)
            info = obj.get("server_info")
            if info is not None and not isinstance(info, dict):
                raise _Bad(f"'server_info' must be an object, got {_show(info)}")
            out.append(Entry(summary, _records(obj),
                             _text(obj, "model_id") or _text(obj, "model"), _text(obj, "date"),
                             info))
        except _Bad as exc:
            raise _Bad(f"entry {i + 1} of {len(objs)}: {exc}") from None
    return out
