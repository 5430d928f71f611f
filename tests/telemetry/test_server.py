"""The /metrics scraper against real loopback servers: the scripted server (its queue is known
by construction: one slot, N requests sent at once), a plain HTTP server serving SGLang's and
vLLM's real names, and a port where nothing listens."""

from __future__ import annotations

import http.server
import threading
import time
from contextlib import contextmanager

import pytest
from http_call import sse

from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script
from servelab.telemetry.server import Scraper, ServerSeries, parse, values

# Excerpts in the engines' own formats (SGLang docs/references/production_metrics.md; vLLM
# v1 loggers.py, counters with the `_total` prometheus_client appends; histograms included so
# that their `_bucket`/`_sum`/`_count` lines are seen and ignored).
SGLANG_PAGE = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 7.0
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 3.0
sglang:token_usage{model_name="m",tp_rank="0"} 0.25
sglang:token_usage{model_name="m",tp_rank="1"} 0.75
sglang:cache_hit_rate{model_name="m"} 0.5
sglang:spec_accept_length{model_name="m"} 2.5
sglang:prompt_tokens_total{model_name="m"} 8.128902e+06
sglang:generation_tokens_total{model_name="m"} 7557572.0
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 4.0
sglang:time_to_first_token_seconds_sum{model_name="m"} 2.3
"""
VLLM_PAGE = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 750.0
vllm:generation_tokens_total{engine="0",model_name="m"} 500.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 3.0
"""


def test_parse_maps_each_engine_to_one_vocabulary():
    s, src = values(parse(SGLANG_PAGE))
    assert s["running_requests"] == 7 and s["queued_requests"] == 3
    assert s["kv_cache_usage"] == 0.5  # a fraction: the ranks' mean, not their sum
    assert s["prefix_cache_hit_rate_gauge"] == 0.5 and s["spec_accept_length_gauge"] == 2.5
    assert s["prompt_tokens"] == 8128902 and s["generation_tokens"] == 7557572
    assert src["running_requests"] == "sglang:num_running_reqs"
    v, src = values(parse(VLLM_PAGE))
    assert v["running_requests"] == 9  # counts sum over data-parallel engines
    assert v["queued_requests"] == 0.0  # served and zero is 0 ...
    assert v["kv_cache_usage"] == 0.4 and v["prefix_cache_hits"] == 750
    assert src["kv_cache_usage"] == "vllm:kv_cache_usage_perc"
    # ... not served is None, never 0
    assert v["spec_drafts"] is None and v["prompt_tokens"] is None
    assert s["prefix_cache_queries"] is None and s["spec_drafts"] is None


def test_parse_skips_garbage_and_nan():
    page = 'vllm:num_requests_running{a="b"} NaN\nvllm:num_requests_waiting oops\n' \
           'sglang:num_queue_reqs 2\n{broken\n\n'
    v, _ = values(parse(page))
    assert v["running_requests"] is None and v["queued_requests"] == 2


def test_rates_and_windows_from_counters():
    s = ServerSeries(url="x", interval_s=1.0)
    base = dict.fromkeys(s.values)
    for t, gen, q, h in ((0.0, 100, 1000, 0), (1.0, 150, 1400, 100), (2.0, 250, 2000, 400),
                         (3.0, 20, 2000, 400)):  # at t=3 the server restarted
        s.add(t, {**base, "generation_tokens": gen, "prefix_cache_queries": q,
                   "prefix_cache_hits": h})
    assert s.rate("generation_tokens") == [50.0, 100.0, None]
    w = s.window(0, 2)
    assert w["output_tok_s"] == 75.0 and w["prefix_cache_hit_rate"] == 0.4
    assert w["input_tok_s"] is None and w["spec_accept_length"] is None
    assert s.window(0, 3)["output_tok_s"] is None
    with pytest.raises(ValueError, match="gauge"):
        s.rate("queued_requests")


def _stream(url: str, n_tokens: int) -> None:
    sse(url, "/v1/completions", {"model": "scripted-model", "prompt": "hi",
                                 "max_tokens": n_tokens, "stream": True, "ignore_eos": True})


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_scraper_sees_the_scripted_queue_rise_and_drain(flavor):
    """One slot, 6 requests of 0.05 + 9 * 0.01 = 0.14 s sent at once: the queue holds 5, then
    drains one per 0.14 s; 60 tokens are generated in all."""
    script = Script(ttft_ms=50, gap_ms=10, max_running=1, flavor=flavor)
    with serve_in_thread(script) as srv:
        with Scraper(srv.url + "/metrics", interval_s=0.05) as sc:
            time.sleep(0.1)
            threads = [threading.Thread(target=_stream, args=(srv.url, 10)) for _ in range(6)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            time.sleep(0.1)
        series = sc.series
    q = series.gauge("queued_requests")
    run = series.gauge("running_requests")
    assert q[0] == 0 and q[-1] == 0, q
    assert max(q) in (4, 5), q  # 5 once all six arrived (4 if a scrape fell between arrivals)
    assert max(run) == 1  # one slot
    peak = q.index(max(q))
    assert all(q[i] >= q[i + 1] for i in range(peak, len(q) - 1)), f"queue not draining: {q}"
    gen = series.gauge("generation_tokens")
    assert gen[0] == 0 and gen[-1] == 60
    assert series.gauge("kv_cache_usage") == [None] * len(q)  # the scripted server has none
    assert all(e is None for e in series.errors)
    assert series.cpu_s > 0 and series.wall_s > 0.7
    doc = series.to_json()
    assert "kv_cache_usage" not in doc["series"] and doc["failed_scrapes"] == 0


@contextmanager
def _page_server(pages: list[str]):
    """A loopback HTTP server answering /metrics with the next page of `pages` (the last one
    repeated), as a real engine's counters advance between scrapes."""
    served = []

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the scraper uses it

        def do_GET(self):  # noqa: N802
            body = pages[min(len(served), len(pages) - 1)].encode()
            served.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/metrics", served
    finally:
        srv.shutdown()
        srv.server_close()


def test_scraper_keeps_a_fixed_grid_and_one_connection():
    with _page_server([VLLM_PAGE]) as (url, served):
        with Scraper(url, interval_s=0.1) as sc:
            time.sleep(0.55)
    t = sc.series.t_s
    assert 6 <= len(t) <= 8, t  # ticks at 0, 0.1, ..., 0.5 and the last one at stop
    assert all(abs(x - 0.1 * i) < 0.05 for i, x in enumerate(t[:-1])), t
    assert len(served) == len(t)
    assert sc.series.sources["running_requests"] == "vllm:num_requests_running"


def test_a_dead_endpoint_gives_failed_samples_not_zeros():
    with _page_server([VLLM_PAGE]) as (url, _):
        pass  # closed: nothing listens on that port any more
    with Scraper(url, interval_s=0.05) as sc:
        time.sleep(0.12)
    s = sc.series
    assert len(s.t_s) >= 2 and all(e and "Error" in e for e in s.errors), s.errors
    assert all(v is None for col in s.values.values() for v in col)
    assert s.to_json()["failed_scrapes"] == len(s.t_s)


def test_bad_urls_and_intervals_are_refused():
    with pytest.raises(ValueError, match="http"):
        Scraper("localhost:8000/metrics")
    with pytest.raises(ValueError, match="interval"):
        Scraper("http://127.0.0.1:1/metrics", interval_s=0)


def test_the_scraper_sends_the_api_key_a_guarded_metrics_endpoint_asks_for():
    """A server started with an API key that guards /metrics (the scripted server's --api-key,
    as SGLang's did): without the header every scrape is a 401 (None values, never 0); with the
    bench's Authorization header the scrapes read the server's gauges."""
    key = "sk-scrape-7Hq2"
    with serve_in_thread(Script(ttft_ms=1, gap_ms=1, api_key=key)) as srv:
        with Scraper(srv.url + "/metrics", interval_s=0.05) as bare:
            time.sleep(0.08)
        with Scraper(srv.url + "/metrics", interval_s=0.05,
                     headers={"Authorization": f"Bearer {key}"}) as keyed:
            time.sleep(0.08)
    assert bare.series.errors and all(e and "401" in e for e in bare.series.errors)
    assert all(v is None for v in bare.series.gauge("running_requests"))
    assert all(e is None for e in keyed.series.errors) and len(keyed.series.t_s) >= 2
    assert keyed.series.gauge("running_requests")[0] == 0
