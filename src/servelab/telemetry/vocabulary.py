"""One vocabulary for the engines' Prometheus series: our name -> SGLang's, vLLM's and the
embedded engine's names, in the order they are tried (docs/METRICS.md has the table).

Names are given without the `_total` suffix that prometheus_client appends to counters on the
wire (vLLM declares `Counter(name="vllm:prefix_cache_queries")` and serves
`vllm:prefix_cache_queries_total`); the parser drops it. The embedded engine serves vLLM's names
(and SGLang's for running/queued requests; src/servelab/mini/server/metrics.py), so it needs no
column of its own here: its column in the docs says which of these it serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class Series:
    """One quantity: `kind` gauge (a level, read as is) or counter (cumulative, read as a rate or
    a ratio of deltas between scrapes); `agg` how several label sets (data-parallel engines,
    models) combine: sum for counts, mean for fractions."""

    name: str
    kind: Literal["gauge", "counter"]
    engine_names: tuple[str, ...]
    agg: Literal["sum", "mean"] = "sum"
    doc: str = ""


SERIES: tuple[Series, ...] = (
    Series("running_requests", "gauge", ("sglang:num_running_reqs", "vllm:num_requests_running"),
           doc="requests in the running batch"),
    Series("queued_requests", "gauge", ("sglang:num_queue_reqs", "vllm:num_requests_waiting"),
           doc="requests waiting for admission"),
    Series("kv_cache_usage", "gauge",
           ("sglang:token_usage", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
           agg="mean", doc="fraction of KV-cache slots in use, 0..1"),
    Series("prefix_cache_hit_rate_gauge", "gauge",
           ("sglang:cache_hit_rate", "vllm:gpu_prefix_cache_hit_rate"), agg="mean",
           doc="the server's own recent prefix-cache hit rate (used when no counters)"),
    Series("prefix_cache_queries", "counter", ("vllm:prefix_cache_queries",),
           doc="prompt tokens looked up in the prefix cache"),
    Series("prefix_cache_hits", "counter", ("vllm:prefix_cache_hits",),
           doc="prompt tokens found in the prefix cache"),
    Series("spec_accept_length_gauge", "gauge", ("sglang:spec_accept_length",), agg="mean",
           doc="the server's recent acceptance length (used when no counters)"),
    Series("spec_accept_rate_gauge", "gauge", ("sglang:spec_accept_rate",), agg="mean",
           doc="the server's recent acceptance rate (used when no counters)"),
    Series("spec_drafts", "counter", ("vllm:spec_decode_num_drafts",), doc="verify steps"),
    Series("spec_draft_tokens", "counter", ("vllm:spec_decode_num_draft_tokens",),
           doc="draft tokens proposed"),
    Series("spec_accepted_tokens", "counter", ("vllm:spec_decode_num_accepted_tokens",),
           doc="draft tokens accepted"),
    Series("prompt_tokens", "counter", ("sglang:prompt_tokens", "vllm:prompt_tokens"),
           doc="prefilled prompt tokens"),
    Series("generation_tokens", "counter", ("sglang:generation_tokens", "vllm:generation_tokens"),
           doc="generated tokens"),
    Series("preemptions", "counter", ("vllm:num_preemptions",), doc="requests preempted"),
)

BY_NAME = {s.name: s for s in SERIES}
ENGINE_NAMES = frozenset(n for s in SERIES for n in s.engine_names)
