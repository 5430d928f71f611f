"""`servelab bench` with multi-turn sessions on the command line: synthetic sessions show TTFT
by turn index and the sessions in the table and in --json; ShareGPT conversations replay turn
by turn, capped by --max-turns, sending the server's answers and never the dataset's replies."""

from __future__ import annotations

import json

import orjson
from cli_inproc import cli

from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script


def test_synthetic_sessions_report_ttft_by_turn(monkeypatch, capsys):
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.2)) as h:
        code, out, err = cli(monkeypatch, capsys, "bench", "--base-url", h.url,
                             "--num-sessions", "3", "--turns", "4", "--input-len", "5",
                             "--output-len", "2", "--max-active-conversations", "2",
                             "--think-time", "uniform:0-0.01", "--json", "--no-store",
                             "--quiet")
    assert code == 0, err
    s = json.loads(out)["load_points"][0]
    assert s["load_key"] == "c=2" and s["completed"] == 12 and s["sessions_finished"] == 3
    assert [r["turn"] for r in s["by_turn"]] == [1, 2, 3, 4]
    assert [r["input_tokens_median"] for r in s["by_turn"]] == [5, 12, 19, 26]
    assert s["think_time"] == "uniform:0-0.01" and s["session_turns_planned"] == 12
    assert "turn 4 (n=3, 26 tok in)" in err and "sessions finished / started" in err


def test_sharegpt_conversations_replay_turn_by_turn(monkeypatch, capsys, tmp_path):
    # 2 conversations of 3 turns; reply k of conversation c is "DATASET ck" k+1 times
    convs = [{"conversations": [m for k in range(3) for m in (
        {"from": "human", "value": f"q{c}{k} please"},
        {"from": "gpt", "value": f"DATASET {c}{k} " * (k + 1)})]} for c in range(2)]
    path = tmp_path / "conv.json"
    path.write_bytes(orjson.dumps(convs))
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.2, echo=True)) as h:
        code, out, err = cli(monkeypatch, capsys, "bench", "--base-url", h.url,
                             "--dataset-path", str(path), "--num-sessions", "2",
                             "--max-turns", "2", "--concurrency", "2", "--json", "--no-store",
                             "--quiet")
        log = h.log()
    assert code == 0, err
    s = json.loads(out)["load_points"][0]
    assert s["dataset_name"] == "sharegpt" and s["completed"] == 4 and s["sessions_finished"] == 2
    assert not any("DATASET" in r["text"] for r in log)  # the dataset's replies are never sent
    for c in range(2):  # --max-turns 2: turn 3 (q{c}2) is never sent
        t1 = next(r for r in log if r["text"] == f"q{c}0 please")
        t2 = next(r for r in log if f"q{c}1" in r["text"])
        assert t1["max_tokens"] == 2 and t2["max_tokens"] == 4  # the replies' lengths
        assert t2["text"] == f"q{c}0 please" + t1["word"] * 2 + f"\nq{c}1 please"
    assert not any("q02" in r["text"] or "q12" in r["text"] for r in log)


def test_session_flags_need_sessions_and_no_sweep(monkeypatch, capsys):
    code, _, err = cli(monkeypatch, capsys, "bench", "--base-url", "http://127.0.0.1:9",
                       "--turns", "3", "--concurrency", "1", "--no-store")
    assert code == 2 and "add --num-sessions N" in err
    code, _, err = cli(monkeypatch, capsys, "bench", "--base-url", "http://127.0.0.1:9",
                       "--num-sessions", "3", "--sweep", "--no-store")
    assert code == 2 and "--sweep's rates are requests/s" in err
    code, _, err = cli(monkeypatch, capsys, "bench", "--base-url", "http://127.0.0.1:9",
                       "--num-sessions", "3", "--think-time", "gauss:2", "--concurrency", "1",
                       "--no-store")
    assert code == 2 and "the distribution is one of constant, exponential, uniform" in err
