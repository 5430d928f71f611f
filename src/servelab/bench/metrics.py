"""Token events -> per-request records -> load-point summary. Every latency metric of servelab
is defined here, once (docs/METRICS.md gives the same definitions in prose).

- TTFT: request sent -> first event carrying a content token.
- E2E: request sent -> the end marker `data: [DONE]` received (the end of the stream).
- TPOT: (E2E - TTFT) / (output_tokens - 1), the first token excluded (SGLang/vLLM definition);
  None for a one-token answer.
- ITL (per token): a chunk of k tokens that arrives a gap g after the previous one counts as k
  gaps of g/k; the first chunk has no ITL. Pooled over all tokens of all completed requests.
- Chunk gap: the raw gap between consecutive content chunks (what vLLM calls ITL); with
  speculative decoding it is about TPOT x acceptance length.
- Output tokens: the server's count (`usage.completion_tokens`, SGLang `meta_info`) when given;
  else counted with the local tokenizer; else one per chunk (flagged in the record's source).
  Where the API does not say how many tokens a chunk holds, the count is spread over the chunks
  in proportion to their text length (exact when tokens have equal length, as in the scripted
  server; an estimate for real text).
- Dispatch lag (open loop): request sent - its due time on the schedule; the client is behind
  when more than 1% of the requests (and at least 2: one hiccup of the machine is not a trend)
  left more than LAG_LIMIT_MS late, i.e. the p99 lag exceeds it, or when the lag grows by more
  than LAG_GROWTH_LIMIT_MS from the first tenth of the requests to the last.
- TTFT by turn index (`by_turn`): per 1-based turn of the requests that carry one (multi-turn
  sessions, a Bailian trace), the completed requests, their TTFT median and p90, and their
  median input and cached tokens: how the first token slows as the history grows.
- Sessions: a session is finished when every turn it planned completed; its duration runs from
  its first turn sent to its last answer's end (think times included). `turns_completed` counts
  each session's completed turns, finished or not.
- Cached tokens: the prompt tokens the server says it reused from its prefix cache
  (`usage.prompt_tokens_details.cached_tokens`, SGLang `meta_info.cached_tokens`); the cached
  token share of a load point is their sum over the input tokens of the completed requests.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from servelab.bench.client import RawResult
from servelab.bench.workload import RequestSpec

STAT_KEYS = ("mean", "median", "p90", "p95", "p99", "std")
# Behind the schedule: a dispatch lag over 10 ms is a tenth of a typical TTFT under load (~100
# ms) and twice this client's p99 on a busy 2-core box for a trace with bursts of 20 (5-7 ms,
# docs/METRICS.md): past it, the load measured is no longer the load asked for.
LAG_LIMIT_MS = 10.0
LAG_GROWTH_LIMIT_MS = 10.0
LATENCY_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "chunk_gap_ms", "e2e_ms")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request as measured (times in ms; None where not measured)."""

    index: int
    ok: bool
    error: str | None
    error_detail: str | None
    http_status: int | None
    start_s: float  # request sent, seconds after the load point started
    t_start_ns: int  # the same instant on the host's monotonic clock (perf_counter_ns)
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    itl_ms: tuple[float, ...]
    chunk_gap_ms: tuple[float, ...]
    chunk_tokens: tuple[int, ...]
    input_tokens: int | None
    input_tokens_source: str | None  # 'usage', 'workload', None
    output_tokens: int | None
    output_tokens_source: str | None  # 'usage', 'meta_info', 'tokenizer', 'chunks'
    requested_output_tokens: int
    spec_verify_ct: int | None
    response_id: str | None
    cached_tokens: int | None = None  # as the server reported; None when it did not say
    dispatch_lag_ms: float | None = None  # open loop: sent - due; None in closed loop
    scheduled_s: float | None = None  # the workload's own arrival time (trace), if any
    session_id: str | None = None
    turn: int | None = None
    prefix_group: int | None = None
    prefix_len: int | None = None
    session_turns: int | None = None  # turns its session planned (multi-turn workloads)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (dataclasses.asdict deep-copies every float: 10x slower here)."""
        d = {f: getattr(self, f) for f in self.__slots__}
        for k in ("itl_ms", "chunk_gap_ms", "chunk_tokens"):
            d[k] = list(d[k])
        return d


def split_tokens(texts: list[str], total: int) -> list[int]:
    """Spread `total` tokens over chunks in proportion to their text length (largest remainder),
    at least one per chunk while there are enough tokens."""
    n = len(texts)
    if n == 0:
        return []
    if total <= n:
        return [1] * total + [0] * (n - total)
    lens = [len(t) for t in texts]
    s = sum(lens)
    base = [1] * n  # every content chunk holds at least one token
    rest = total - n
    weights = [(x / s) if s else 1.0 / n for x in lens]
    shares = [rest * w for w in weights]
    floors = [int(math.floor(x)) for x in shares]
    left = rest - sum(floors)
    order = sorted(range(n), key=lambda i: shares[i] - floors[i], reverse=True)
    for i in order[:left]:
        floors[i] += 1
    return [b + f for b, f in zip(base, floors, strict=True)]


def first_token_ms(raw: RawResult) -> float | None:
    """TTFT of a completed request (ms), as its record would give it; None when it failed."""
    if raw.error is not None or not raw.events:
        return None
    return (raw.events[0][0] - raw.t_start_ns) * 1e-6


def make_record(raw: RawResult, spec: RequestSpec, t0_ns: int,
                count: Callable[[str], int] | None = None) -> RequestRecord:
    """Derive one request's record from its events (the only place latencies are computed)."""
    ev = raw.events
    ok = raw.error is None
    ms = 1e-6
    known = [e[1] for e in ev]
    if ev and all(k is not None for k in known):
        chunk_tokens = [int(k) for k in known]  # type: ignore[arg-type]
        out = raw.completion_tokens if raw.completion_tokens is not None else sum(chunk_tokens)
        out_src = "meta_info"
    else:
        texts = [e[2] for e in ev]
        if raw.completion_tokens is not None:
            out, out_src = raw.completion_tokens, "usage"
        elif count is not None and ev:
            out, out_src = count("".join(texts)), "tokenizer"
        else:
            out, out_src = len(ev), "chunks"
        chunk_tokens = split_tokens(texts, out)
    ttft = (ev[0][0] - raw.t_start_ns) * ms if ev else None
    e2e = (raw.t_end_ns - raw.t_start_ns) * ms if ok else None
    tpot = None
    if ok and ttft is not None and e2e is not None and out is not None and out > 1:
        tpot = (e2e - ttft) / (out - 1)
    itl: list[float] = []
    gaps: list[float] = []
    for i in range(1, len(ev)):
        g = (ev[i][0] - ev[i - 1][0]) * ms
        gaps.append(g)
        k = chunk_tokens[i]
        if k > 0:
            itl.extend([g / k] * k)
    counted = bool(ev) or raw.completion_tokens is not None  # else no output to count
    if raw.prompt_tokens is not None:
        inp, inp_src = raw.prompt_tokens, "usage"
    elif spec.input_len is not None:
        inp, inp_src = spec.input_len, "workload"
    else:
        inp, inp_src = None, None
    return RequestRecord(
        index=raw.index, ok=ok, error=raw.error, error_detail=raw.error_detail,
        http_status=raw.http_status, start_s=(raw.t_start_ns - t0_ns) / 1e9,
        t_start_ns=raw.t_start_ns,
        ttft_ms=ttft if ok else None, tpot_ms=tpot, e2e_ms=e2e,
        itl_ms=tuple(itl) if ok else (), chunk_gap_ms=tuple(gaps) if ok else (),
        chunk_tokens=tuple(chunk_tokens), input_tokens=inp, input_tokens_source=inp_src,
        output_tokens=out if counted else None,
        output_tokens_source=out_src if counted else None,
        requested_output_tokens=spec.output_len, spec_verify_ct=raw.spec_verify_ct,
        response_id=raw.response_id, cached_tokens=raw.cached_tokens,
        dispatch_lag_ms=(raw.t_start_ns - raw.t_due_ns) * ms if raw.t_due_ns is not None else None,
        scheduled_s=spec.arrival_s, session_id=spec.session_id, turn=spec.turn,
        prefix_group=spec.prefix_group, prefix_len=spec.prefix_len,
        session_turns=spec.session_turns,
    )


def stats(values: Iterable[float]) -> dict[str, float | None]:
    """mean, median, p90, p95, p99, std (population) of the values; all None when there are
    none. p95 is what SLOs are often written against (and what GuideLLM and vLLM's `--metric-
    percentiles 50,95,99` report), so it is kept beside p90 and p99."""
    a = np.fromiter((v for v in values if v is not None), dtype=np.float64)
    if a.size == 0:
        return dict.fromkeys(STAT_KEYS)
    return {"mean": float(a.mean()), "median": float(np.median(a)),
            "p90": float(np.percentile(a, 90)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)),
            "std": float(a.std())}


def dispatch_lag(records: list[RequestRecord]) -> dict[str, Any]:
    """Median, p99, max dispatch lag (ms) of the open loop's requests, in send order, and whether
    the client fell behind the schedule (module docstring); all None in a closed loop."""
    lags = [r.dispatch_lag_ms for r in sorted(records, key=lambda r: r.t_start_ns)
            if r.dispatch_lag_ms is not None]
    if not lags:
        return {"dispatch_lag_ms": None, "dispatch_behind": None}
    a = np.asarray(lags)
    tenth = max(1, a.size // 10)
    growth = float(np.median(a[-tenth:]) - np.median(a[:tenth])) if a.size >= 20 else 0.0
    late = int((a > LAG_LIMIT_MS).sum())
    return {"dispatch_lag_ms": {"median": float(np.median(a)), "p99": float(np.percentile(a, 99)),
                                "max": float(a.max()), "growth": growth, "late": late},
            "dispatch_behind": bool((late >= 2 and late > 0.01 * a.size)
                                    or growth > LAG_GROWTH_LIMIT_MS)}


def prefix_cache(done: list[RequestRecord]) -> dict[str, Any]:
    """Cached prompt tokens as the server reported them, beside what the workload shares.

    vLLM omits `prompt_tokens_details` when it cached nothing, so once any request of the load
    point reports cached tokens, a completed request that reports none counts as 0 in the share
    (its record keeps None). `prefix_share` is the workload's own upper bound: the share of
    input tokens an earlier request already sent as a prefix (shared-prefix groups, trace hash
    ids), what a perfect, never-evicting prefix cache would reuse."""
    rep = [r.cached_tokens for r in done if r.cached_tokens is not None]
    inp = sum(r.input_tokens or 0 for r in done)
    known = [r.prefix_len for r in done if r.prefix_len is not None]
    return {
        "cached_tokens_reported": len(rep),
        "cached_tokens_total": sum(rep) if rep else None,
        "cached_token_share": sum(rep) / inp if rep and inp else None,
        "cached_tokens": stats(rep),
        "prefix_share": (sum(known) / inp if known and len(known) == len(done) and inp
                         else None),
    }


def _median(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def by_turn(done: list[RequestRecord]) -> list[dict[str, Any]] | None:
    """Per turn index (module docstring); None when no request has a turn."""
    turns: dict[int, list[RequestRecord]] = {}
    for r in done:
        if r.turn is not None:
            turns.setdefault(r.turn, []).append(r)
    if not turns:
        return None
    out = []
    for t in sorted(turns):
        rs = turns[t]
        st = stats(r.ttft_ms for r in rs)
        out.append({"turn": t, "completed": len(rs),
                    "ttft_ms": {"median": st["median"], "p90": st["p90"]},
                    "input_tokens_median": _median([r.input_tokens for r in rs
                                                    if r.input_tokens is not None]),
                    "cached_tokens_median": _median([r.cached_tokens for r in rs
                                                     if r.cached_tokens is not None])})
    return out


def sessions(records: list[RequestRecord]) -> dict[str, Any]:
    """Sessions started, finished, their durations (s) and completed turns (module
    docstring); all None when no request belongs to a session."""
    by: dict[str, list[RequestRecord]] = {}
    for r in records:
        if r.session_id is not None:
            by.setdefault(r.session_id, []).append(r)
    if not by:
        return {"sessions": None, "sessions_finished": None, "session_duration_s": None,
                "turns_completed": None}
    done_turns, durations = [], []
    for rs in by.values():
        ok = [r for r in rs if r.ok]
        done_turns.append(len(ok))
        planned = rs[0].session_turns
        if ok and len(ok) == len(rs) and (planned is None or len(ok) == planned):
            end = max(r.t_start_ns + (r.e2e_ms or 0.0) * 1e6 for r in ok)
            durations.append((end - min(r.t_start_ns for r in ok)) / 1e9)
    st = stats(done_turns)
    return {"sessions": len(by), "sessions_finished": len(durations),
            "session_duration_s": stats(durations),
            "turns_completed": {"mean": st["mean"], "median": st["median"],
                                "min": min(done_turns), "max": max(done_turns)}}


def meets_slo(r: RequestRecord, slo: dict[str, float]) -> bool:
    """A completed request meets every SLO given; a metric it does not have (TPOT of a one-token
    answer) cannot violate one."""
    if not r.ok:
        return False
    for k, limit in slo.items():
        v = getattr(r, k)
        if v is not None and v > limit:
            return False
    return True


def summarize(records: list[RequestRecord], duration_s: float,
              goodput_slo: dict[str, float] | None) -> dict[str, Any]:
    """The latency/throughput part of the load-point summary (docs/METRICS.md)."""
    done = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    dur = duration_s if duration_s > 0 else None
    out_tok = sum(r.output_tokens or 0 for r in done)
    in_known = [r.input_tokens for r in done if r.input_tokens is not None]
    in_tok = sum(in_known) if len(in_known) == len(done) else None

    def rate(x: float | None) -> float | None:
        return None if x is None or dur is None else x / dur

    s: dict[str, Any] = {
        "ttft_ms": stats(r.ttft_ms for r in done),
        "tpot_ms": stats(r.tpot_ms for r in done if r.tpot_ms is not None),
        "itl_ms": stats(x for r in done for x in r.itl_ms),
        "chunk_gap_ms": stats(x for r in done for x in r.chunk_gap_ms),
        "e2e_ms": stats(r.e2e_ms for r in done),
        "completed": len(done),
        "failed": len(failed),
        "failure_reasons": dict(Counter(r.error for r in failed)),
        "duration_s": dur,
        "total_input_tokens": in_tok if done else None,
        "total_output_tokens": out_tok if done else None,
        "output_throughput_tok_s": rate(out_tok) if done else None,
        "input_throughput_tok_s": rate(in_tok) if done else None,
        "total_throughput_tok_s": rate(in_tok + out_tok) if done and in_tok is not None else None,
        "request_throughput_req_s": rate(len(done)),
        "goodput_req_s": (rate(sum(meets_slo(r, goodput_slo) for r in done))
                          if goodput_slo else None),
        "goodput_slo": dict(goodput_slo) if goodput_slo else None,
        "output_tokens_source": dict(Counter(r.output_tokens_source for r in done)),
        "output_len_mismatch": sum(1 for r in done if r.output_tokens is not None
                                   and r.output_tokens != r.requested_output_tokens),
    }
    s.update(dispatch_lag(records))
    s.update(prefix_cache(done))
    s["by_turn"] = by_turn(done)
    s.update(sessions(records))
    return s
