"""Speculative-decoding acceptance length (tau: tokens produced per verify step, bonus included),
from the best source at hand, always named:

1. `response:spec_verify_ct` - SGLang `/generate` meta_info per request:
   tau = sum(completion_tokens - 1) / sum(spec_verify_ct). The first token comes from prefill,
   not a verify step, so we subtract it (SGLang's own tests divide without subtracting, which
   reads high by 1/spec_verify_ct).
2. `metrics:vllm` - Prometheus counters scraped before and after the load point:
   tau = 1 + d(vllm:spec_decode_num_accepted_tokens) / d(vllm:spec_decode_num_drafts);
   acceptance rate = d(accepted) / d(num_draft_tokens).
3. `metrics:sglang` - the gauge `sglang:spec_accept_length` read after the load point (a recent
   average kept by the server, not exactly this window).
4. `estimate:tokens_per_chunk` - client side: output tokens per streamed chunk after the first:
   sum(output_tokens - first_chunk_tokens) / sum(chunks - 1). Reads high when the server batches
   several steps into one chunk (SGLang --stream-interval > 1), so it is only an estimate, and it
   is not used when the server's /metrics answered with no sign of speculation (`speculating`:
   such a server is not speculating, so accept_length is None).
"""

from __future__ import annotations

from typing import Any

from servelab.bench.metrics import RequestRecord

VLLM_DRAFTS = "vllm:spec_decode_num_drafts"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
VLLM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"  # label `position`
VLLM_SPEC_PREFIX = "vllm:spec_decode"   # every vLLM speculative counter starts with it
SGLANG_ACCEPT_LENGTH = "sglang:spec_accept_length"
SGLANG_ACCEPT_RATE = "sglang:spec_accept_rate"


def parse_prometheus(text: str | None) -> dict[str, float]:
    """Sample values by metric name (labels summed over, e.g. several engines or models); the
    counter suffix `_total` is dropped so names match across prometheus_client versions. A
    sample labelled `position` (vLLM's accepted tokens per draft position) is kept apart, as
    `name#N` for position N."""
    if not text:
        return {}
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name.endswith(("_created", "_bucket")):
                    continue
                name = s.name[:-6] if s.name.endswith("_total") else s.name
                if "position" in s.labels:
                    name = f"{name}#{s.labels['position']}"
                out[name] = out.get(name, 0.0) + float(s.value)
    except ValueError:
        return {}
    return out


def from_response(records: list[RequestRecord]) -> float | None:
    """tau from SGLang's per-request spec_verify_ct (prefill token excluded)."""
    rs = [r for r in records if r.ok and r.spec_verify_ct and r.output_tokens]
    if not rs:
        return None
    steps = sum(r.spec_verify_ct or 0 for r in rs)
    return sum((r.output_tokens or 0) - 1 for r in rs) / steps if steps else None


def from_vllm(before: dict[str, float], after: dict[str, float]) -> tuple[float | None, float | None]:
    """(tau, acceptance rate) over the window between two scrapes of vLLM counters."""
    if VLLM_DRAFTS not in after or VLLM_ACCEPTED not in after:
        return None, None
    if not before:  # the first scrape failed: the counters' lifetime totals are not this window
        return None, None
    d_drafts = after[VLLM_DRAFTS] - before.get(VLLM_DRAFTS, 0.0)
    d_acc = after[VLLM_ACCEPTED] - before.get(VLLM_ACCEPTED, 0.0)
    if d_drafts <= 0:
        return None, None
    rate = None
    if VLLM_DRAFT_TOKENS in after:
        d_tok = after[VLLM_DRAFT_TOKENS] - before.get(VLLM_DRAFT_TOKENS, 0.0)
        rate = d_acc / d_tok if d_tok > 0 else None
    return 1.0 + d_acc / d_drafts, rate


def vllm_counts(before: dict[str, float], after: dict[str, float]) -> dict[str, Any] | None:
    """The window's vLLM speculative counts, as `vllm bench serve` reports them: drafts, draft
    tokens, accepted tokens (counter deltas) and the acceptance rate per draft position
    (accepted at position i / drafts). None without both scrapes or without a draft."""
    if not before or VLLM_DRAFTS not in after:
        return None
    d = {k: after.get(name, 0.0) - before.get(name, 0.0) for k, name in (
        ("num_drafts", VLLM_DRAFTS), ("draft_tokens", VLLM_DRAFT_TOKENS),
        ("accepted_tokens", VLLM_ACCEPTED))}
    if d["num_drafts"] <= 0:
        return None
    pos = sorted(int(k.rpartition("#")[2]) for k in after
                 if k.startswith(VLLM_ACCEPTED_PER_POS + "#") and k.rpartition("#")[2].isdigit())
    per_pos = [(after[f"{VLLM_ACCEPTED_PER_POS}#{i}"]
                - before.get(f"{VLLM_ACCEPTED_PER_POS}#{i}", 0.0)) / d["num_drafts"] for i in pos]
    return {"num_drafts": int(d["num_drafts"]),
            "draft_tokens": int(d["draft_tokens"]) if VLLM_DRAFT_TOKENS in after else None,
            "accepted_tokens": int(d["accepted_tokens"]) if VLLM_ACCEPTED in after else None,
            "per_position_acceptance_rates": per_pos or None}


def from_sglang(after: dict[str, float]) -> tuple[float | None, float | None]:
    """(tau, acceptance rate) from SGLang's gauges after the load point."""
    tau = after.get(SGLANG_ACCEPT_LENGTH)
    return (tau if tau and tau > 0 else None), after.get(SGLANG_ACCEPT_RATE)


def speculating(metrics: dict[str, float]) -> bool:
    """Whether scraped metrics show speculation: vLLM exports its spec_decode counters only when
    speculating; SGLang exports `sglang:spec_accept_length` always (0 without speculation)."""
    return any(k.startswith(VLLM_SPEC_PREFIX) for k in metrics) or bool(
        metrics.get(SGLANG_ACCEPT_LENGTH, 0.0) > 0)


def estimate(records: list[RequestRecord]) -> float | None:
    """Client-side tau estimate: tokens per content chunk, the first (prefill) chunk excluded."""
    toks = chunks = 0
    for r in records:
        if r.ok and len(r.chunk_tokens) >= 2:
            toks += sum(r.chunk_tokens[1:])
            chunks += len(r.chunk_tokens) - 1
    return toks / chunks if chunks else None


def acceptance(records: list[RequestRecord], before: dict[str, float],
               after: dict[str, float]) -> dict[str, Any]:
    """The summary fields: accept_length and its source (the first available of the four), the
    acceptance rate when a server reports one, and every source's value for cross-checking."""
    resp = from_response(records)
    v_tau, v_rate = from_vllm(before, after)
    # the SGLang gauge is the server's recent average, not a window delta: it says nothing about
    # a load point in which no request completed (it used to report the previous traffic's tau)
    s_tau, s_rate = from_sglang(after) if any(r.ok for r in records) else (None, None)
    est = estimate(records)
    candidates = {"response:spec_verify_ct": resp, "metrics:vllm": v_tau,
                  "metrics:sglang": s_tau, "estimate:tokens_per_chunk": est}
    # A server whose /metrics answered with no sign of speculation is not speculating: its
    # chunks can still carry several tokens (held-back partial UTF-8, stream intervals), which
    # the estimate would misread as acceptance. It stays in by_source, but not as tau.
    usable = dict(candidates)
    if after and not speculating(after):
        usable["estimate:tokens_per_chunk"] = None
    source = next((k for k, v in usable.items() if v is not None), None)
    rate = v_rate if source == "metrics:vllm" else s_rate if source == "metrics:sglang" else None
    return {"accept_length": candidates[source] if source else None,
            "accept_length_source": source, "accept_rate": rate,
            "accept_length_by_source": candidates, "spec_decode_counts": vllm_counts(before, after)}
