"""`[load]` and `[workload]` of an experiment file for the workloads of real traffic: a trace
replayed on its own clock (`replay = true`, load key "replay") and shared-prefix groups become
the same bench configuration as `servelab bench --dataset-name ...`, checked the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.bench.config import LoadPoint
from servelab.bench.run import run_load_point
from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script
from servelab.errors import UserError
from servelab.experiment.design.parse import parse

TRACE = str(Path(__file__).resolve().parents[3] / "examples" / "traces" / "azure_sample.csv")


def spec(load: dict, workload: dict):
    return parse({"name": "t", "engine": "external", "url": "http://127.0.0.1:1",
                  "arms": {"a": {}, "b": {}}, "load": load, "workload": workload})


def test_a_trace_replays_as_the_load_point_replay():
    s = spec({"replay": True, "concurrency": [2]},
             {"trace": TRACE, "trace_speed": 8.0, "num_prompts": 12, "trace_start_s": 1.0})
    assert [k for k, _, _ in s.load.keys()] == ["c=2", "replay"]
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.2)) as h:
        cfg = s.workload.bench_config(h.url)
        assert cfg.workload.kind == "trace" and cfg.workload.trace_speed == 8.0
        # what run/measure.py builds from the key: neither concurrency nor rate
        _, c, r = s.load.keys()[1]
        res = run_load_point(cfg, LoadPoint(concurrency=c, request_rate=r), progress=False)
    sm = res.summary
    assert sm["load_key"] == "replay" and sm["completed"] == 12 and sm["trace_format"] == "azure"
    assert sm["dispatch_lag_ms"] is not None and sm["trace_start_s"] == 1.0


def test_shared_prefix_groups_and_one_source_at_a_time():
    s = spec({"request_rate": [4]}, {"shared_prefix": {"num_groups": 2, "prompts_per_group": 3,
                                                       "system_prompt_len": 64}})
    w = s.workload.bench_config("http://127.0.0.1:1").workload
    assert (w.kind, w.gsp_num_groups, w.gsp_prompts_per_group, w.gsp_system_prompt_len,
            w.gsp_question_len) == ("generated-shared-prefix", 2, 3, 64, 128)
    with pytest.raises(UserError, match="give one of dataset, trace, shared_prefix"):
        spec({"concurrency": [1]}, {"trace": TRACE, "shared_prefix": {}})
    with pytest.raises(UserError, match="replay = true"):
        spec({}, {"trace": TRACE})
    with pytest.raises(UserError, match="trace_speed"):
        spec({"replay": True}, {"trace": TRACE, "trace_speed": 0})


def test_replay_of_a_workload_without_times_is_refused():
    s = spec({"replay": True}, {"input_len": 4, "output_len": 2, "num_prompts": 2})
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.2)) as h, \
            pytest.raises(UserError, match="has none: use --dataset-name trace"):
        run_load_point(s.workload.bench_config(h.url), LoadPoint(), progress=False)


def test_sessions_become_the_bench_sessions_and_run_as_sessions_in_flight():
    s = spec({"concurrency": [2]}, {"input_len": 4, "output_len": 2,
                                    "sessions": {"num_sessions": 3, "turns": 2,
                                                 "think_time": "uniform:0-0.01"}})
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.2)) as h:
        cfg = s.workload.bench_config(h.url)
        ss = cfg.workload.sessions
        assert ss is not None and (ss.num_sessions, ss.turns, str(ss.think_time)) == \
            (3, 2, "uniform:0-0.01")
        res = run_load_point(cfg, LoadPoint(concurrency=2), progress=False)
    sm = res.summary
    assert sm["completed"] == 6 and sm["sessions_finished"] == 3
    assert [r["turn"] for r in sm["by_turn"]] == [1, 2]
    with pytest.raises(UserError, match="think_time"):
        spec({"concurrency": [1]}, {"sessions": {"think_time": "gauss:1"}})
    with pytest.raises(UserError, match="sessions come from"):
        spec({"concurrency": [1]}, {"trace": TRACE, "sessions": {}})
    with pytest.raises(UserError, match="not per session"):
        spec({"sweep": {"slo": "ttft_p99_ms=2000"}}, {"sessions": {}})


def test_warmup_until_steady_in_the_workload_becomes_the_bench_option():
    s = spec({"request_rate": [4.0]}, {"warmup_until_steady": True, "max_warmup_s": 30})
    cfg = s.workload.bench_config("http://127.0.0.1:1")
    assert cfg.warmup_until_steady and cfg.max_warmup_s == 30.0 and cfg.warmup == 0
    assert not spec({"request_rate": [4.0]}, {}).workload.bench_config(
        "http://127.0.0.1:1").warmup_until_steady
    with pytest.raises(UserError, match="two warm-ups"):
        spec({"request_rate": [4.0]}, {"warmup_until_steady": True, "warmup": 5})
    with pytest.raises(UserError, match="max_warmup_s"):
        spec({"request_rate": [4.0]}, {"warmup_until_steady": True, "max_warmup_s": 0})
    # under twice the online test's 5-s window no warm-up can end steady: refused, with
    # the minimum named
    with pytest.raises(UserError, match="max_warmup_s = 5 .* at least 10"):
        spec({"request_rate": [4.0]}, {"warmup_until_steady": True, "max_warmup_s": 5})
    assert spec({"request_rate": [4.0]}, {"warmup_until_steady": True, "max_warmup_s": 10})


def test_the_scrape_interval_in_the_workload_becomes_the_bench_option():
    url = "http://127.0.0.1:1"
    assert spec({"concurrency": [1]}, {}).workload.bench_config(url).scrape_interval_s == 1.0
    cfg = spec({"concurrency": [1]}, {"scrape_interval_s": 0.25}).workload.bench_config(url)
    assert cfg.scrape_interval_s == 0.25
    assert spec({"concurrency": [1]}, {"scrape_interval_s": 0}).workload.bench_config(
        url).scrape_interval_s == 0  # telemetry off
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(UserError, match="scrape_interval_s"):
            spec({"concurrency": [1]}, {"scrape_interval_s": bad})
