"""Telemetry over live load points (bench/run.py + telemetry/point.py) against the scripted
server in its own process, one slot (`max_running=1`): a request of 10 tokens holds it
20 + 9 x 10 = 110 ms, so the server completes at most 9.1 req/s by construction. Sent 16 req/s
for 5 s its queue must rise throughout (+6.9 req/s fluid) and drain after the load; sent
4 req/s it must be steady. The series go to the store beside the per-request records and come
back through `results show --json`."""

from __future__ import annotations

import json
import sys

import pytest

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.run import run_load_point
from servelab.bench.scripted.harness import serve_subprocess
from servelab.bench.scripted.script import Script
from servelab.store import Store

SCRIPT = Script(ttft_ms=20, gap_ms=10, max_running=1, record_log=False)
CAPACITY = 1000 / (20 + 9 * 10)  # req/s


def _bench(monkeypatch, capsys, *args: str) -> str:
    from servelab.cli import main

    monkeypatch.setattr(sys, "argv", ["servelab", *args])
    with pytest.raises(SystemExit) as ei:
        main()
    out = capsys.readouterr().out
    assert ei.value.code in (0, None), out
    return out


def test_above_capacity_the_queue_series_rises_and_drains_and_the_point_is_named(
        monkeypatch, capsys, tmp_path):
    db, doc = tmp_path / "r.db", tmp_path / "out.json"
    with serve_subprocess(SCRIPT) as h:
        text = _bench(monkeypatch, capsys, "bench", "--base-url", h.url, "--request-rate", "16",
                      "--num-prompts", "80", "--random-input-len", "4", "--random-output-len",
                      "10", "--scrape-interval", "0.25", "--quiet", "--store", str(db),
                      "--output", str(doc))
    s = json.loads(doc.read_text())["load_points"][0]
    assert s["steadiness"]["status"] == "above_saturation", s["steadiness"]
    assert s["steadiness"]["queue_source"] == "server"
    slope = s["steadiness"]["trends"]["queue"]["slope_per_s"]
    assert 0.75 * (16 - CAPACITY) < slope < 1.25 * (16 - CAPACITY)
    assert s["max_queued_requests"] >= 20  # ~34 by the fluid limit over 5 s
    assert s["above_saturation"] is True and s["steady_window"] is None
    assert "ABOVE SATURATION" in text and "rate=16 is ABOVE SATURATION" in " ".join(text.split())
    # no GPU on this machine: "n/a" once, in the summary, energy missing (not 0)
    assert s["telemetry"]["gpu_status"].startswith("n/a") and s["j_per_output_token"] is None
    assert s["telemetry"]["scrape_cpu_share"] < 0.01  # the scraper's own thread CPU
    # the stored series: the queue rises during the load and drains to 0 after it
    with Store(db) as st:
        row = st.load_points()[0]
        series = st.telemetry(row)
    srv = series["server"]
    q, t = srv["series"]["queued_requests"], srv["t_s"]
    peak = q.index(max(q))
    assert series["load_start_s"] < t[peak] <= series["load_end_s"] + 0.5
    assert q[-1] == 0 and max(q) >= 20
    during = [x for x, tt in zip(q, t, strict=True)
              if series["load_start_s"] + 1 <= tt <= series["load_last_sent_s"]]
    assert during[-1] > during[0] + 10  # it rose over the load
    assert series["gpu"]["status"].startswith("n/a") and series["gpu"]["series"] == {}
    # `results show` shows the verdict; its --json carries the summary's fields
    shown = _bench(monkeypatch, capsys, "results", "show", str(row.id), "--store", str(db))
    assert "steadiness" in shown and "ABOVE SATURATION" in shown
    js = json.loads(_bench(monkeypatch, capsys, "results", "show", str(row.id), "--json",
                           "--telemetry", "--store", str(db)))
    assert js["summary"]["steadiness"]["status"] == "above_saturation"
    assert js["telemetry"]["server"]["series"]["queued_requests"] == q


def test_below_capacity_steady_and_telemetry_off_leaves_the_fields_missing():
    with serve_subprocess(SCRIPT) as h:
        wl = WorkloadConfig(num_prompts=20, input_len=4, output_len=10)
        on = run_load_point(BenchConfig(base_url=h.url, workload=wl, scrape_interval_s=0.25),
                            LoadPoint(request_rate=4.0), progress=False)
        off = run_load_point(BenchConfig(base_url=h.url, workload=wl, scrape_interval_s=0),
                             LoadPoint(request_rate=4.0), progress=False)
    s = on.summary
    assert s["steadiness"]["status"] == "steady", s["steadiness"]["reason"]
    assert s["above_saturation"] is False and s["max_queued_requests"] <= 2
    # the steady window's requests: those sent inside the span, their TPOT the law's 10 ms
    win = s["steady_window"]
    assert 10 <= win["requests"] <= 20 and win["completed"] == win["requests"]
    assert win["tpot_ms"]["median"] == pytest.approx(10.0, abs=1.5)
    assert on.telemetry is not None and len(on.telemetry["server"]["t_s"]) >= 16
    assert off.telemetry is None
    assert off.summary["steadiness"] is None and off.summary["telemetry"] is None
    assert off.summary["steady_window"] is None
    assert off.summary["completed"] == 20
    # the before/after reads for speculative acceptance are untouched by the scraper
    assert s["metrics_scraped"] is True and off.summary["metrics_scraped"] is True


def test_a_server_without_metrics_is_judged_on_the_clients_own_counts():
    # /metrics answers 404: every scrape fails (counted, not fatal), no queue is served, and
    # the steadiness test runs on the client's in-flight count and TTFTs
    s = Script(ttft_ms=20, gap_ms=10, max_running=1, record_log=False, metrics=False)
    with serve_subprocess(s) as h:
        res = run_load_point(BenchConfig(
            base_url=h.url, workload=WorkloadConfig(num_prompts=48, input_len=4, output_len=10),
            scrape_interval_s=0.5), LoadPoint(request_rate=16.0), progress=False)
    t = res.summary["telemetry"]
    assert t["scrapes"] >= 6 and t["failed_scrapes"] == t["scrapes"] and t["served"] == []
    assert res.summary["max_queued_requests"] is None  # not served: missing, not 0
    st = res.summary["steadiness"]
    assert st["queue_source"] == "client_in_flight"
    # 16 req/s into 9.1: the backlog grows over the 3-s load
    assert st["status"] in ("above_saturation", "unsteady"), st["reason"]
    assert st["trends"]["queue"]["direction"] == "up"
