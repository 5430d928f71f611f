"""One load point written as vLLM writes `vllm bench serve --save-result`: its key names, its
key order, its units (per-request times in seconds, statistics in ms), its default file name and
its `--append-result` layout (one JSON object per line). The reverse of engines.from_vllm: that
importer reads these files back to the same summary (docs/METRICS.md has the table).

The layout is that of vLLM's `vllm/benchmarks/serve.py` at commit 009e6d4a1cd6 (main, late
2026; PyPI's newest release then was 0.33.0), generative task with a tokenizer:

- always: date, endpoint_type, backend, label, model_id, tokenizer_id, num_prompts, the
  `--metadata` keys, request_rate ("inf" or a number), burstiness, max_concurrency, duration,
  completed, failed, total_input_tokens, total_output_tokens, request_throughput,
  request_goodput, output_throughput, total_token_throughput, latencies, queue_times,
  max_output_tokens_per_s, max_concurrent_requests, rtfx; then mean_/median_/std_/p{N}_ X _ms
  for each X of --percentile-metrics (default ttft,tpot,itl) and N of --metric-percentiles
  (default 99); client_queue_time only when asked and the loop is closed, as vLLM;
- with --save-detailed also: input_lens, output_lens, ttfts, itls, start_times,
  generated_texts, errors (vLLM drops exactly these without it; latencies and queue_times stay);
- the six spec_decode_* keys when the acceptance was read from vLLM's own /metrics counters:
  acceptance rate (%), length, the window's draft counts and the rate per draft position.

vLLM's ITL is the gap between streamed chunks: our `chunk_gap_ms`, not our per-token `itl_ms`.
Where vLLM writes 0 for a statistic of no values (np.mean(0)), this writes null: a value not
measured is never 0. A failed request keeps vLLM's convention in the per-request lists (ttft
0.0, no itls, latency 0.0, output length 0, text "", its error); a completed request's value
that was not measured is null (generated_texts: the text is not kept, so null).
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from servelab import atomic
from servelab.errors import UserError

# vLLM's --percentile-metrics names -> (our summary key, what each request contributes)
METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "chunk_gap_ms", "e2el": "e2e_ms",
           "client_queue_time": None, "e2el_including_client_queue": None}
DEFAULT_METRICS = ("ttft", "tpot", "itl")
DETAIL_KEYS = ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts",
               "errors")
BACKENDS = {"completions": "openai", "chat": "openai-chat", "sglang": "sglang"}
_SUMMARY_STATS = {"mean", "median", "std", "p90", "p95", "p99"}


@dataclass(frozen=True, slots=True)
class VllmResultConfig:
    """Where and how `--save-result` writes (vLLM's flags of the same names)."""

    result_dir: str | None = None
    result_filename: str | None = None
    detailed: bool = False
    append: bool = False
    metadata: dict[str, str] = field(default_factory=dict)
    percentile_metrics: tuple[str, ...] = DEFAULT_METRICS
    percentiles: tuple[float, ...] = (99.0,)
    several_points: bool = False  # a sweep or a list of loads: one file per point

    def folder(self) -> Path:
        """--result-dir joined with --result-filename's own folder, as vLLM joins them."""
        return Path(self.result_dir or ".") / Path(self.result_filename or "f").parent


def parse_percentile_metrics(text: str | None) -> tuple[str, ...]:
    if text is None:
        return DEFAULT_METRICS
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [n for n in names if n not in METRICS]
    if bad or not names:
        raise UserError(f"--percentile-metrics {text!r}: use a comma-separated list of "
                        f"{', '.join(METRICS)} (e.g. ttft,tpot,itl,e2el)")
    return names


def parse_percentiles(text: str) -> tuple[float, ...]:
    out = []
    for part in (p.strip() for p in text.split(",")):
        try:
            p = float(part)
        except ValueError:
            p = math.nan
        if not 0 < p <= 100:
            raise UserError(f"--metric-percentiles {text!r}: {part!r} is not a percentile in "
                            "(0, 100]; e.g. --metric-percentiles 50,90,99")
        out.append(p)
    return tuple(out)


def parse_metadata(items: list[str] | tuple[str, ...] | None) -> dict[str, str]:
    """`--metadata KEY=VALUE` (repeated, or several pairs in one quoted value) as vLLM keeps
    them: strings, after num_prompts; a key of the result itself is refused."""
    out: dict[str, str] = {}
    for item in items or ():
        for pair in item.split():
            key, eq, value = pair.partition("=")
            if not eq or not key.strip():
                raise UserError(f"--metadata {pair!r}: use KEY=VALUE, e.g. --metadata "
                                "version=0.3.3 --metadata tp=1")
            if key.strip() in _RESERVED or _STAT_KEY.fullmatch(key.strip()):
                raise UserError(f"--metadata {pair!r}: {key.strip()!r} is a key of the result "
                                "itself; choose another name")
            out[key.strip()] = value.strip()
    return out


_RESERVED = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id",
             "num_prompts", "request_rate", "burstiness", "max_concurrency", "duration",
             "completed", "failed", "total_input_tokens", "total_output_tokens",
             "request_throughput", "request_goodput", "output_throughput",
             "total_token_throughput", "latencies", "queue_times", "max_output_tokens_per_s",
             "max_concurrent_requests", "rtfx", *DETAIL_KEYS}
_STAT_KEY = re.compile(r"(mean|median|std|p[\d.]+)_\w+_ms|spec_decode_\w+")


def p_word(p: float) -> str:
    """vLLM's name of a percentile: 99 -> 'p99', 99.9 -> 'p99.9'."""
    return "p" + (str(int(p)) if int(p) == p else str(p))


def _queue_s(r: dict[str, Any], closed: bool) -> float | None:
    """vLLM's client queue time: sent - arrived. Open loop: the dispatch lag (sent - due);
    closed loop (vLLM's rate inf with a concurrency: every request arrives at the start and
    waits for a slot): sent - the load point's start; else not measured."""
    if r.get("dispatch_lag_ms") is not None:
        return r["dispatch_lag_ms"] / 1e3
    return r.get("start_s") if closed else None


def _values(name: str, done: list[dict[str, Any]], closed: bool) -> list[float]:
    """The per-request values (ms) a statistic of `name` is taken over: as metrics.summarize."""
    if name == "itl":
        return [g for r in done for g in r.get("chunk_gap_ms") or ()]
    if name == "client_queue_time":
        qs = [_queue_s(r, closed) for r in done]
        return [q * 1e3 for q in qs if q is not None]
    key = METRICS[name]
    return [r[key] for r in done if r.get(key) is not None]


def _stats(name: str, summary: dict[str, Any], done: list[dict[str, Any]], closed: bool,
           percentiles: tuple[float, ...]) -> dict[str, float | None]:
    """mean/median/std/p{N} of one metric in ms: the summary's own value where it has it, else
    numpy's (linear) percentile of the same values; null when there are none."""
    have = summary.get(METRICS[name] or "") or {}
    vals: list[float] | None = None

    def get(stat: str, p: float | None = None) -> float | None:
        nonlocal vals
        if stat in _SUMMARY_STATS and stat in have:
            return have[stat]
        if vals is None:
            vals = _values(name, done, closed)
        if not vals:
            return None
        a = np.asarray(vals, dtype=np.float64)
        return float({"mean": np.mean, "median": np.median, "std": np.std}[stat](a)) \
            if p is None else float(np.percentile(a, p))

    out = {f"mean_{name}_ms": get("mean"), f"median_{name}_ms": get("median"),
           f"std_{name}_ms": get("std")}
    for p in percentiles:
        out[f"{p_word(p)}_{name}_ms"] = get(p_word(p), p)
    return out


def peaks(records: list[dict[str, Any]]) -> tuple[float | None, int | None]:
    """vLLM's max_output_tokens_per_s (the most output tokens in one 1-s bucket from the first
    completed request's start; vLLM counts a chunk as one token, this counts its tokens) and
    max_concurrent_requests (the most completed requests in flight at once, intervals
    [sent, end), an end before a start at the same instant: vLLM's sweep line at the commit
    named above; earlier vLLM counted requests active in the peak-token 1-s bucket, which
    reads higher); None without a completed one."""
    done = [r for r in records if r["ok"] and r.get("ttft_ms") is not None
            and r.get("e2e_ms") is not None]
    if not done:
        return None, None
    t0 = min(r["t_start_ns"] for r in done)
    buckets: dict[int, int] = {}
    events: list[tuple[int, int]] = []
    for r in done:
        t = (r["t_start_ns"] - t0) / 1e9 + r["ttft_ms"] / 1e3
        toks = list(r.get("chunk_tokens") or [1])
        gaps = list(r.get("chunk_gap_ms") or ())
        for i, k in enumerate(toks):
            if i > 0:
                t += gaps[i - 1] / 1e3 if i - 1 < len(gaps) else 0.0
            buckets[int(t)] = buckets.get(int(t), 0) + int(k)
        events += [(r["t_start_ns"], 1), (r["t_start_ns"] + int(r["e2e_ms"] * 1e6), -1)]
    now = peak = 0
    for _, d in sorted(events):
        now += d
        peak = max(peak, now)
    return float(max(buckets.values())), peak


def _per_request(records: list[dict[str, Any]], closed: bool) -> dict[str, list]:
    """The per-request lists in vLLM's units (seconds), in send order."""
    s = 1e-3

    def ms_to_s(r: dict[str, Any], key: str) -> float | None:
        if not r["ok"]:
            return 0.0  # vLLM's value for a failed request
        return r[key] * s if r.get(key) is not None else None

    return {
        "input_lens": [r.get("input_tokens") for r in records],
        "output_lens": [r.get("output_tokens") if r["ok"] else 0 for r in records],
        "ttfts": [ms_to_s(r, "ttft_ms") for r in records],
        "itls": [[g * s for g in r.get("chunk_gap_ms") or ()] if r["ok"] else []
                 for r in records],
        "latencies": [ms_to_s(r, "e2e_ms") for r in records],
        "start_times": [r["t_start_ns"] / 1e9 for r in records],  # perf_counter, as vLLM
        "queue_times": [_queue_s(r, closed) for r in records],
        "generated_texts": [None if r["ok"] else "" for r in records],
        "errors": ["" if r["ok"] else (r.get("error") or "unknown error") for r in records],
    }


def _spec_decode(s: dict[str, Any]) -> dict[str, Any]:
    """vLLM's six spec_decode_* keys when the acceptance was read from vLLM's /metrics counters
    (as vLLM writes them only then): the rate in %, the length, the window's counts and the
    rate per draft position (`spec_decode_counts`; null in a summary of an earlier release)."""
    tau = (s.get("accept_length_by_source") or {}).get("metrics:vllm")
    if tau is None:
        return {}
    rate = s.get("accept_rate") if s.get("accept_length_source") == "metrics:vllm" else None
    n = s.get("spec_decode_counts") or {}
    return {"spec_decode_acceptance_rate": rate * 100.0 if rate is not None else None,
            "spec_decode_acceptance_length": tau, "spec_decode_num_drafts": n.get("num_drafts"),
            "spec_decode_draft_tokens": n.get("draft_tokens"),
            "spec_decode_accepted_tokens": n.get("accepted_tokens"),
            "spec_decode_per_position_acceptance_rates": n.get("per_position_acceptance_rates")}


def result_document(summary: dict[str, Any], records: list[dict[str, Any]], *,
                    cfg: VllmResultConfig, api: str, tokenizer: str | None, label: str | None,
                    burstiness: float, date: str | None = None) -> dict[str, Any]:
    """One load point as vLLM's result object, keys in vLLM's order (module docstring)."""
    s = summary
    conc, rate = s.get("concurrency"), s.get("request_rate")
    closed = conc is not None and s.get("sessions") is None
    recs = sorted(records, key=lambda r: r["t_start_ns"])
    done = [r for r in recs if r["ok"]]
    per = _per_request(recs, closed)
    peak_tok_s, peak_conc = peaks(recs)
    model = s.get("model")
    doc: dict[str, Any] = {
        "date": date or time.strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": BACKENDS.get(api, api), "backend": BACKENDS.get(api, api),
        "label": label, "model_id": model, "tokenizer_id": tokenizer or model,
        "num_prompts": s.get("num_prompts"), **cfg.metadata,
        "request_rate": "inf" if rate is None or math.isinf(rate) else rate,
        "burstiness": burstiness, "max_concurrency": conc,
        "duration": s.get("duration_s"), "completed": s.get("completed"),
        "failed": s.get("failed"), "total_input_tokens": s.get("total_input_tokens"),
        "total_output_tokens": s.get("total_output_tokens"),
        "request_throughput": s.get("request_throughput_req_s"),
        "request_goodput": s.get("goodput_req_s"),
        "output_throughput": s.get("output_throughput_tok_s"),
        "total_token_throughput": s.get("total_throughput_tok_s"),
        **{k: per[k] for k in ("input_lens", "output_lens", "ttfts", "itls", "latencies",
                               "start_times", "queue_times", "generated_texts", "errors")},
        "max_output_tokens_per_s": peak_tok_s, "max_concurrent_requests": peak_conc,
        "rtfx": 0.0,  # input audio seconds / duration: no audio is sent
    }
    doc.update(_spec_decode(s))
    for name in cfg.percentile_metrics:
        if name == "e2el_including_client_queue" or (name == "client_queue_time" and not closed):
            continue  # vLLM: only with a concurrency (and, for the first, a finite rate)
        doc.update(_stats(name, s, done, closed, cfg.percentiles))
    if not cfg.detailed:
        for k in DETAIL_KEYS:
            doc.pop(k)
    return doc


def file_path(cfg: VllmResultConfig, doc: dict[str, Any]) -> Path:
    """vLLM's default name `{label or backend}-{rate}qps[-concurrency{C}]-{model}-{date}.json`,
    or --result-filename; with several load points and no --append-result, the load part
    (`-{rate}qps[-concurrency{C}]`) is added to --result-filename's stem, one file per point."""
    rate = doc["request_rate"]
    load = f"{'inf' if rate == 'inf' else float(rate)}qps" + (
        f"-concurrency{doc['max_concurrency']}" if doc["max_concurrency"] is not None else "")
    if cfg.result_filename:
        name = Path(Path(cfg.result_filename).name)
        if cfg.several_points and not cfg.append:
            name = name.with_name(f"{name.stem}-{load}{name.suffix}")
    else:
        model = str(doc["model_id"] or "unknown-model").split("/")[-1]
        name = Path(f"{doc['label'] or doc['backend']}-{load}-{model}-{doc['date']}.json")
    return cfg.folder() / name


def write(cfg: VllmResultConfig, doc: dict[str, Any]) -> Path:
    """Write (or with --append-result add a line to) the point's file, atomically: readers see
    the old file or the new one. json.dumps as vLLM's json.dump: one line per result."""
    path = file_path(cfg, doc)
    data = json.dumps(doc).encode()
    try:
        if cfg.append and path.exists():
            old = path.read_bytes()
            data = old + (b"\n" if old else b"") + data
        atomic.write_bytes(path, data)
    except OSError as exc:
        raise UserError(f"--save-result {path}: cannot write ({exc.strerror or exc}); give a "
                        "--result-dir you can write") from None
    return path
