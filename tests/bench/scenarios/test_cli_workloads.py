"""`servelab bench` with the workloads of real traffic, on the command line as SGLang spells it:
each sample trace replays on its own clock (the scripted server's arrival log follows the file),
shared-prefix groups report the cached tokens beside TTFT, and a client that cannot keep up
says so in the table, the warning and --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_inproc import cli

from servelab.bench.datasets.trace import read_window
from servelab.bench.scripted.harness import serve_in_thread, serve_subprocess
from servelab.bench.scripted.script import Script

TRACES = Path(__file__).resolve().parents[3] / "examples" / "traces"


@pytest.mark.parametrize("name", ["mooncake_sample.jsonl", "bailian_sample.jsonl",
                                  "azure_sample.csv", "burstgpt_sample.csv"])
def test_each_sample_trace_replays_on_its_clock(monkeypatch, capsys, name):
    path = str(TRACES / name)
    win = read_window(path, speed=4.0, cap=40)
    # the server in its own process: on a thread it would share the client's GIL and clock
    with serve_subprocess(Script(ttft_ms=2, gap_ms=0.2, cache_block=16)) as h:
        code, out, err = cli(monkeypatch, capsys, "bench", "--base-url", h.url,
                             "--dataset-name", "trace", "--dataset-path", path,
                             "--trace-speed", "4", "--num-prompts", "40", "--json", "--no-store")
        log = h.log()
    assert code == 0, err
    s = json.loads(out)["load_points"][0]
    assert s["load_key"] == "replay" and s["completed"] == len(win.rows) == 40
    assert s["dataset_name"] == "trace" and s["trace_format"] == win.format
    assert s["input_len_exact"] is True
    assert [r["prompt_tokens"] for r in log] == [r.input_len for r in win.rows]
    # the server saw the file's clock, sped up 4x: arrival gaps as in the file, within a few ms
    arr = sorted(r["arrival_ns"] for r in log)
    seen = [(a - arr[0]) / 1e9 for a in arr]
    worst = max(abs(x - y) for x, y in zip(seen, win.arrivals_s, strict=True))
    assert worst < 0.05, worst
    assert s["dispatch_lag_ms"]["median"] < 5.0  # (whether it fell behind: test_replay.py)
    assert "dispatch lag ms" in err and "replay" in err
    if win.format in ("mooncake", "bailian"):  # hash ids: shared blocks found in the cache
        assert s["cached_tokens_reported"] > 0 and s["prefix_share"] > 0


def test_shared_prefix_groups_show_cached_tokens_beside_ttft(monkeypatch, capsys):
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.2, cache_block=8)) as h:
        code, out, err = cli(monkeypatch, capsys, "bench", "--base-url", h.url,
                             "--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "2",
                             "--gsp-prompts-per-group", "3", "--gsp-system-prompt-len", "32",
                             "--gsp-question-len", "4", "--gsp-output-len", "2",
                             "--concurrency", "1", "--no-store", "--quiet")
    assert code == 0, err
    lines = out.splitlines()
    ttft = next(i for i, x in enumerate(lines) if "TTFT ms" in x)
    assert "cached tokens/req" in lines[ttft + 1]
    # 4 of the 6 requests (all but each group's first) reuse 32 of their 36 tokens
    assert "cached token share" in out and "59.3% (reported by 4 of 6" in out, out


def test_a_client_behind_its_schedule_says_so(monkeypatch, capsys, tmp_path):
    p = tmp_path / "flood.jsonl"
    p.write_text("".join(json.dumps({"timestamp": 0, "input_length": 2, "output_length": 1,
                                     "hash_ids": [i]}) + "\n" for i in range(1500)))
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0, record_log=False)) as h:
        code, out, err = cli(monkeypatch, capsys, "bench", "--base-url", h.url,
                             "--dataset-name", "trace", "--dataset-path", str(p),
                             "--num-prompts", "1500", "--json", "--no-store")
    assert code == 0, err
    s = json.loads(out)["load_points"][0]
    assert s["dispatch_behind"] is True
    assert "fell behind the arrival schedule" in err and "BEHIND SCHEDULE" in err
