"""`--warmup-until-steady` end to end against the scripted server in its own process: the
server's own log is the reference for what was sent. Every request it saw is a warm-up, a
measured or a cool-down request; the records and the headline statistics are exactly the
measured ones (matched by the server's response ids), sent after the warm-up's and before the
cool-down's; the throughput is theirs over their own span, and so are the server's
speculative counts (an ordinary point of the same prompts is their reference). The server
guards its generation endpoints and /metrics with an API key, so the scrapes only succeed if
the key reaches the scraper too."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest
from cli_inproc import cli

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.run import run_load_point
from servelab.bench.scripted.harness import serve_subprocess
from servelab.bench.scripted.script import Script

KEY = "sk-steady-4Rt9"


def test_only_the_measured_span_after_a_steady_warm_up_is_measured(monkeypatch):
    monkeypatch.setenv("SERVELAB_API_KEY", KEY)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    n = 40
    # 8 tokens in 4 verify steps of 2 (vLLM's spec counters): each request holds 28 ms
    script = Script(ttft_ms=20, gap_ms=2, api_key=KEY, tokens_per_chunk=2)
    with serve_subprocess(script) as h:
        cfg = BenchConfig(base_url=h.url, workload=WorkloadConfig(input_len=4, output_len=8,
                                                                  num_prompts=n, seed=5),
                          warmup_until_steady=True, max_warmup_s=20.0, steady_window_s=1.5,
                          scrape_interval_s=0.25)
        res = run_load_point(cfg, LoadPoint(request_rate=40.0), progress=False)
        log = h.log()
        plain = run_load_point(replace(cfg, warmup_until_steady=False),
                               LoadPoint(request_rate=40.0), progress=False).summary
    s = res.summary
    assert s["warmup_until_steady"] and s["warmup_verdict"]["status"] == "steady", s
    assert s["warmup_s"] >= 2 * 1.5 and s["warmup_requests"] >= 2 * 1.5 * 40 * 0.5
    # the measured span: exactly num_prompts requests, all completed, and nothing else
    assert s["issued"] == s["completed"] == len(res.records) == n and s["failed"] == 0
    measured = {r["response_id"] for r in res.records}
    seen = {e["id"]: e for e in log}
    assert measured <= set(seen) and len(measured) == n
    others = sorted(e["arrival_ns"] for i, e in seen.items() if i not in measured)
    # every request the server saw is accounted for (a cool-down request cancelled before
    # its bytes left never reached it)
    sent = s["warmup_requests"] + s["cooldown_requests"]
    assert sent - s["abandoned_requests"] <= len(others) <= sent
    first = min(seen[i]["arrival_ns"] for i in measured)
    last = max(seen[i]["arrival_ns"] for i in measured)
    before = sum(1 for t in others if t < first)
    after = sum(1 for t in others if t > last)
    # warm-up requests came before the measured ones, cool-down requests after (two sends
    # less than a millisecond apart may swap on the way)
    assert abs(before - s["warmup_requests"]) <= 1 and before + after >= len(others) - 2
    # the headline statistics are the measured requests' own
    ttft = [r["ttft_ms"] for r in res.records]
    assert s["ttft_ms"]["median"] == pytest.approx(statistics.median(ttft))
    span_s = (max(r["t_start_ns"] + r["e2e_ms"] * 1e6 for r in res.records)
              - min(r["t_start_ns"] for r in res.records)) / 1e9
    assert s["duration_s"] == pytest.approx(span_s, rel=1e-6)
    assert s["request_throughput_req_s"] == pytest.approx(n / span_s, rel=1e-6)
    # the API key reached the scraper: the guarded /metrics answered every scrape
    tel = s["telemetry"]
    assert s["metrics_scraped"] and tel["scrapes"] >= 4 and tel["failed_scrapes"] == 0, tel
    # the speculative counts are the measured span's: an ordinary point's 4 drafts a request,
    # give or take the few warm-up and cool-down requests answered inside the span (~1.1 in
    # flight at 40 req/s x 28 ms), not the warm-up's hundreds
    drafts = plain["spec_decode_counts"]["num_drafts"]
    assert drafts == 4 * n
    assert drafts <= s["spec_decode_counts"]["num_drafts"] <= drafts + 4 * 8, s
    assert s["accept_length"] == pytest.approx(plain["accept_length"])  # 7 tokens / 4 steps
    # the client's CPU over the loop's own time (warm-up to cool-down), not the measured span's
    loop_s = s["client_cpu_s"] / s["client_cpu_util"]
    assert s["warmup_s"] + s["duration_s"] <= loop_s <= s["warmup_s"] + s["duration_s"] + 1.0
    assert plain["client_cpu_s"] / plain["client_cpu_util"] == pytest.approx(plain["duration_s"])
    # the warm-up's TTFTs from the steady window's start are in the steadiness test: at 40
    # req/s over a window of at least 1.5 s, 60 more than the measured ones
    assert s["steadiness"]["trends"]["ttft_ms"]["n"] >= n + 50, s["steadiness"]


@pytest.mark.parametrize(("extra", "message"), [
    (("--concurrency", "4", "--warmup-until-steady"), "finite --request-rate"),
    (("--request-rate", "4,inf", "--warmup-until-steady"), "finite --request-rate"),
    (("--request-rate", "4", "--warmup-until-steady", "--warmup", "3"), "two warm-ups"),
    (("--request-rate", "4", "--warmup-until-steady", "--max-warmup-s", "-1"), "--max-warmup-s"),
    # a cap under the shortest warm-up that can end steady (twice the 5-s window) would make
    # every point unsteady, and a --max-duration within it would measure nothing
    (("--request-rate", "4", "--warmup-until-steady", "--max-warmup-s", "5"), "at least 10"),
    (("--request-rate", "4", "--warmup-until-steady", "--max-duration", "8"),
     "more than 10 s"),
    (("--request-rate", "4", "--max-warmup-s", "30"), "add --warmup-until-steady"),
])
def test_the_option_is_refused_where_it_cannot_apply(monkeypatch, capsys, extra, message):
    code, out, err = cli(monkeypatch, capsys, "bench", "--base-url", "http://127.0.0.1:9",
                         "--no-store", *extra)
    assert code == 2 and message in out + err and "Traceback" not in out + err
