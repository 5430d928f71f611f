"""Multi-turn sessions against the scripted server in echo mode (its log keeps every prompt as
received; each request is answered with a word of its own, ` w7 w7 ...` for request 7): turn k
sends turns 1..k-1 and exactly the answers the server gave them, on the completions API as one
transcript and on the chat API as messages; think time passes between an answer and the next
turn; a failed turn ends its session."""

from __future__ import annotations

import asyncio
import random

import pytest

from servelab.bench.config import BenchConfig, LoadPoint, SessionsConfig, ThinkTime, WorkloadConfig
from servelab.bench.datasets.sessions import session_specs
from servelab.bench.run import prompt_seed, run_load_point
from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script, count_tokens
from servelab.bench.workload import TURN_SEP

S, T, IN, OUT = 3, 3, 6, 4


async def _count(text: str) -> int:  # the scripted server's /tokenize: one token per word
    return count_tokens(text)


def _planned(ss: SessionsConfig, load_key: str) -> dict[tuple[str, int], str]:
    """The new user text of each (session, turn), as the load point drew it."""
    rng = random.Random(prompt_seed(0, load_key))
    specs = asyncio.run(session_specs(ss, IN, OUT, None, rng, _count, 4))
    return {(s.session_id, s.turn): s.prompt for s in specs}


def _run(api: str, ss: SessionsConfig, load: LoadPoint, script: Script | None = None):
    with serve_in_thread(script or Script(ttft_ms=2, gap_ms=0.5, echo=True)) as h:
        cfg = BenchConfig(base_url=h.url, api=api,
                          workload=WorkloadConfig(input_len=IN, output_len=OUT, sessions=ss))
        res = run_load_point(cfg, load, progress=False)
        log = {r["id"]: r for r in h.log()}
    return res, log


def _turns(res) -> dict[str, list[dict]]:
    by: dict[str, list[dict]] = {}
    for r in sorted(res.records, key=lambda r: r["turn"]):
        by.setdefault(r["session_id"], []).append(r)
    return by


def test_completions_turn_k_sends_the_transcript_with_the_servers_own_answers():
    ss = SessionsConfig(num_sessions=S, turns=T)
    load = LoadPoint(concurrency=2)
    res, log = _run("completions", ss, load)
    new = _planned(ss, load.key)
    sessions = _turns(res)
    assert len(sessions) == S and all(len(t) == T for t in sessions.values())
    for sid, turns in sessions.items():
        want = ""
        for r in turns:
            got = log[r["response_id"]]
            text = new[(sid, r["turn"])]
            assert count_tokens(text) == IN  # exact length of new user text per turn
            want = text if r["turn"] == 1 else want + TURN_SEP + text
            assert got["text"] == want, (sid, r["turn"])
            want += got["word"] * OUT  # the answer streamed back, never a dataset's
        # later turns are longer: each carries the earlier ones
        lens = [r["input_tokens"] for r in turns]
        assert lens == [IN * k + OUT * (k - 1) for k in range(1, T + 1)], lens
        assert [r["prefix_len"] for r in turns] == [0, *lens[:-1]]
    s = res.summary
    assert s["sessions"] == S and s["sessions_finished"] == S and s["completed"] == S * T
    assert [row["turn"] for row in s["by_turn"]] == list(range(1, T + 1))
    assert all(row["completed"] == S and row["ttft_ms"]["median"] > 0 for row in s["by_turn"])
    assert [row["input_tokens_median"] for row in s["by_turn"]] == [IN * k + OUT * (k - 1)
                                                                   for k in range(1, T + 1)]
    assert s["turns_completed"] == {"mean": T, "median": T, "min": T, "max": T}
    # what a cache of prompts could reuse: each turn's previous prompt
    hist = sum(IN * k + OUT * (k - 1) for k in range(1, T))
    assert s["prefix_share"] == hist / sum(IN * k + OUT * (k - 1) for k in range(1, T + 1))


def test_chat_turn_k_sends_the_history_as_messages():
    ss = SessionsConfig(num_sessions=2, turns=T)
    load = LoadPoint(request_rate=50.0)  # sessions start on a Poisson schedule
    res, log = _run("chat", ss, load)
    new = _planned(ss, load.key)
    for sid, turns in _turns(res).items():
        want: list[dict] = []
        for r in turns:
            got = log[r["response_id"]]
            want = [*want, {"role": "user", "content": new[(sid, r["turn"])]}]
            assert got["text"] == want, (sid, r["turn"])
            want = [*want, {"role": "assistant", "content": got["word"] * OUT}]
    assert res.summary["sessions_finished"] == 2
    # an open loop of sessions: each session's first turn has a dispatch lag
    assert sum(r["dispatch_lag_ms"] is not None for r in res.records) == 2


def test_think_time_passes_between_an_answer_and_the_next_turn():
    ss = SessionsConfig(num_sessions=1, turns=3, think_time=ThinkTime("constant", 0.15))
    res, log = _run("completions", ss, LoadPoint(concurrency=1))
    rows = sorted(log.values(), key=lambda r: r["arrival_ns"])
    gaps = [(b["arrival_ns"] - a["done_ns"]) / 1e9 for a, b in zip(rows, rows[1:], strict=False)]
    assert len(gaps) == 2 and all(0.15 <= g < 0.4 for g in gaps), gaps
    d = res.summary["session_duration_s"]["median"]
    assert d >= 0.3, d  # the session's duration includes its think times


def test_a_failed_turn_ends_its_session():
    ss = SessionsConfig(num_sessions=2, turns=3)
    res, _ = _run("completions", ss, LoadPoint(concurrency=2),
                  Script(ttft_ms=1, gap_ms=0.2, fail_rate=1.0))
    s = res.summary
    assert s["failed"] == 2 and s["completed"] == 0  # no answer to continue from
    assert s["sessions"] == 2 and s["sessions_finished"] == 0
    assert s["turns_completed"]["max"] == 0 and s["by_turn"] is None
    assert s["stopped_by_duration"] is False  # the unsent turns are the failures' doing


def test_max_duration_stops_new_turns_and_says_so():
    ss = SessionsConfig(num_sessions=2, turns=5, think_time=ThinkTime("constant", 0.1))
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.2)) as h:
        cfg = BenchConfig(base_url=h.url, max_duration_s=0.25,
                          workload=WorkloadConfig(input_len=IN, output_len=OUT, sessions=ss))
        s = run_load_point(cfg, LoadPoint(concurrency=2), progress=False).summary
    # turns at ~0, 0.1, 0.2 s start before the deadline; the 4th would start at ~0.3 s
    assert 2 <= s["completed"] // 2 <= 3 and s["completed"] < 10, s["completed"]
    assert s["stopped_by_duration"] is True and s["sessions_finished"] == 0


@pytest.mark.parametrize("text,want", [("2", ThinkTime("constant", 2.0)),
                                       ("exponential:0.5", ThinkTime("exponential", 0.5)),
                                       ("uniform:1-3", ThinkTime("uniform", 1.0, 3.0))])
def test_think_time_parses_and_prints_back(text, want):
    assert ThinkTime.parse(text) == want and ThinkTime.parse(str(want)) == want


def test_think_time_draws_follow_their_distribution():
    rng = random.Random(1)
    exp = [ThinkTime("exponential", 2.0).draw(rng) for _ in range(4000)]
    uni = [ThinkTime("uniform", 1.0, 3.0).draw(rng) for _ in range(4000)]
    # mean of 4000 exponential draws: standard error 2/sqrt(4000) = 0.032; 5 of them is 0.16
    assert abs(sum(exp) / len(exp) - 2.0) < 0.16
    assert min(uni) >= 1.0 and max(uni) <= 3.0 and abs(sum(uni) / len(uni) - 2.0) < 0.05
