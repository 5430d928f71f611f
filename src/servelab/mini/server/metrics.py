"""Prometheus exposition of the engine's lifetime counters, read at scrape time.

Names follow vLLM (`vllm:request_success_total{finished_reason}` with vLLM's reasons "stop",
"length", "abort", plus "error" for requests the engine failed, so that a scraper that wants
completed requests sums stop + length, as it would on vLLM; `vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`,
`..._num_accepted_tokens_total`, `..._num_accepted_tokens_per_pos_total{position}`,
`vllm:prompt_tokens_total`, `vllm:generation_tokens_total`, `vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`, a fraction 0..1 despite its name, as vLLM's) and SGLang
(`sglang:spec_accept_length`, `sglang:num_running_reqs`, `sglang:num_queue_reqs`,
`sglang:token_usage`), so the
scrapers written for those engines work unchanged. The prefix cache: `vllm:prefix_cache_queries_total`
and `vllm:prefix_cache_hits_total` in prompt tokens, the same values as
`servelab:prefix_cache_queries_total` / `servelab:prefix_cache_hits_total`, and
`sglang:cache_hit_rate`. Spec-decode series exist only when speculative decoding is on, prefix
cache series only while the cache is on (missing is missing, not 0).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class _EngineCollector:
    def __init__(self, engine, model_name: str, transfers=None) -> None:
        self.engine, self.model, self.transfers = engine, model_name, transfers

    def collect(self):
        e, st, lab = self.engine, self.engine.stats, ["model_name"]
        val = [self.model]

        def counter(name: str, doc: str, v: float):
            c = CounterMetricFamily(name, doc, labels=lab)
            c.add_metric(val, v)
            return c

        def gauge(name: str, doc: str, v: float):
            g = GaugeMetricFamily(name, doc, labels=lab)
            g.add_metric(val, v)
            return g

        done = CounterMetricFamily("vllm:request_success", "Finished requests by reason.",
                                   labels=[*lab, "finished_reason"])
        for reason, v in st.finished.items():
            done.add_metric([*val, reason], v)
        yield done
        yield counter("vllm:prompt_tokens", "Prefilled prompt tokens.", st.prompt_tokens)
        yield counter("vllm:generation_tokens", "Generated tokens.", st.generation_tokens)
        yield gauge("vllm:num_requests_running", "Requests in slots.", e.num_running)
        yield gauge("vllm:num_requests_waiting", "Requests queued.", e.num_waiting)
        yield gauge("sglang:num_running_reqs", "Requests in slots.", e.num_running)
        yield gauge("sglang:num_queue_reqs", "Requests queued.", e.num_waiting)
        usage = e.kv_cache_usage
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = full).", usage)
        yield gauge("sglang:token_usage", "KV-cache token usage (1 = full).", usage)
        if e.k:
            yield counter("vllm:spec_decode_num_drafts", "Verify steps (one per request).",
                          st.spec_num_drafts)
            yield counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.",
                          st.spec_num_draft_tokens)
            yield counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                          st.spec_num_accepted_tokens)
            per = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted draft tokens by draft position.",
                                      labels=[*lab, "position"])
            for i, v in enumerate(st.spec_accepted_per_pos):
                per.add_metric([*val, str(i)], v)
            yield per
        if e.prefix is not None:
            yield from _prefix_series(st, counter, gauge)
        if self.transfers is not None:
            yield from _transfer_series(self.transfers, lab, val)
        if e.k:
            tau = st.avg_spec_accept_length
            if tau is not None:
                yield gauge("sglang:spec_accept_length", "Lifetime mean acceptance length.", tau)
                yield gauge("sglang:spec_accept_rate", "Lifetime draft acceptance rate.",
                            st.spec_num_accepted_tokens / st.spec_num_draft_tokens)


def _prefix_series(st, counter, gauge):
    """The prefix cache, in prompt tokens (present only while it is on; a decode server keeps
    none): vLLM's names, the same values under servelab's, and SGLang's hit rate (lifetime
    here; SGLang's gauge is over recent batches)."""
    q, h = st.prefix_cache_queries, st.prefix_cache_hits
    for ns in ("vllm", "servelab"):
        yield counter(f"{ns}:prefix_cache_queries", "Prompt tokens looked up in the prefix "
                      "cache.", q)
        yield counter(f"{ns}:prefix_cache_hits", "Prompt tokens served by the prefix cache.", h)
    if q:
        yield gauge("sglang:cache_hit_rate", "Prefix cache hits / queries, in tokens.", h / q)


def _transfer_series(t, lab: list[str], val: list[str]):
    """KV transfers of a prefill (direction "sent") or decode (direction "received") server:
    server/pd/wire.TransferStats. Present only on servers in a disaggregation mode."""
    lab, val = [*lab, "direction"], [*val, t.direction]
    b = CounterMetricFamily("servelab:kv_transfer_bytes", "KV handoff bytes moved.", labels=lab)
    b.add_metric(val, t.bytes)
    yield b
    s = CounterMetricFamily("servelab:kv_transfer_seconds",
                            "Seconds spent moving KV handoffs (encode + write when sent; first "
                            "to last byte when received).", labels=lab)
    s.add_metric(val, t.seconds)
    yield s
    n = CounterMetricFamily("servelab:kv_transfers", "KV transfers by outcome.",
                            labels=[*lab, "outcome"])
    outcomes = dict(t.outcomes)  # one copy: the bootstrap thread may add an outcome meanwhile
    for outcome in ("ok", *sorted(k for k in outcomes if k != "ok")):
        n.add_metric([*val, outcome], outcomes.get(outcome, 0))
    yield n
    if t.direction == "received":
        w = CounterMetricFamily("servelab:kv_transfer_wait_seconds",
                                "Seconds decode requests waited for the prefill before the "
                                "first byte of their KV.", labels=lab)
        w.add_metric(val, t.wait_seconds)
        yield w
        q = CounterMetricFamily("servelab:kv_fetch_queued", "Decode requests that waited for a "
                                "KV fetch slot (their prefill had the most fetches in flight).",
                                labels=lab)
        q.add_metric(val, t.queued)
        yield q
        qs = CounterMetricFamily("servelab:kv_fetch_queue_seconds",
                                 "Seconds decode requests waited for a KV fetch slot.", labels=lab)
        qs.add_metric(val, t.queue_seconds)
        yield qs
        qw = GaugeMetricFamily("servelab:kv_fetches_queued",
                               "Decode requests waiting for a KV fetch slot now.", labels=lab)
        qw.add_metric(val, t.queue_waiting)
        yield qw


def render_metrics(engine, model_name: str, transfers=None) -> tuple[bytes, str]:
    """(body, content type) of /metrics; `transfers`: the server's KV transfer counters."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_EngineCollector(engine, model_name, transfers))
    return generate_latest(reg), CONTENT_TYPE_LATEST
