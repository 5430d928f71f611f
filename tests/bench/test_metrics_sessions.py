"""TTFT by turn index and the session metrics of bench/metrics.py, from hand-made records whose
answers are known: medians and p90 per turn, a session cut short is not finished, a session's
duration runs from its first turn sent to its last answer, trace sessions without a planned
turn count."""

from __future__ import annotations

from servelab.bench.client import RawResult
from servelab.bench.metrics import make_record, summarize
from servelab.bench.workload import RequestSpec

MS = 1_000_000


def rec(sid: str | None, turn: int | None, start_ms: int, ttft_ms: int, e2e_ms: int,
        of: int | None = 3, ok: bool = True, prompt: int = 10):
    s = RequestSpec(0, "p", prompt, 2, True, session_id=sid, turn=turn, session_turns=of)
    r = RawResult(index=0, t_start_ns=start_ms * MS, t_end_ns=(start_ms + e2e_ms) * MS,
                  end_marker=ok, completion_tokens=2, prompt_tokens=prompt)
    if ok:
        r.events = [((start_ms + ttft_ms) * MS, None, "a"), ((start_ms + e2e_ms) * MS, None, "b")]
    else:
        r.error = "http_500"
    return make_record(r, s, 0)


def test_ttft_by_turn_and_finished_sessions():
    recs = [
        # session a: 3 turns, finished; turn k's TTFT is 10 k ms
        rec("a", 1, 0, 10, 20, prompt=10), rec("a", 2, 100, 20, 30, prompt=30),
        rec("a", 3, 300, 30, 40, prompt=50),
        # session b: 3 turns, finished; TTFT 30 k ms
        rec("b", 1, 0, 30, 40, prompt=12), rec("b", 2, 50, 60, 70, prompt=34),
        rec("b", 3, 200, 90, 100, prompt=56),
        # session c: turn 2 failed, so it ended there
        rec("c", 1, 0, 50, 60), rec("c", 2, 80, 0, 10, ok=False),
    ]
    s = summarize(recs, 1.0, None)
    by = {row["turn"]: row for row in s["by_turn"]}
    assert sorted(by) == [1, 2, 3]
    assert by[1]["completed"] == 3 and by[1]["ttft_ms"]["median"] == 30.0
    assert abs(by[1]["ttft_ms"]["p90"] - 46.0) < 1e-9  # 10, 30, 50: linear interpolation
    assert by[2]["completed"] == 2 and by[2]["ttft_ms"]["median"] == 40.0  # the failure left out
    assert by[3]["ttft_ms"]["median"] == 60.0 and by[3]["input_tokens_median"] == 53.0
    assert by[1]["cached_tokens_median"] is None  # nobody reported: missing, not 0
    assert s["sessions"] == 3 and s["sessions_finished"] == 2
    # a: 0 -> 340 ms; b: 0 -> 300 ms
    d = s["session_duration_s"]
    assert abs(d["median"] - 0.32) < 1e-9 and abs(d["p90"] - 0.336) < 1e-9
    assert s["turns_completed"] == {"mean": 7 / 3, "median": 3.0, "min": 1, "max": 3}


def test_a_session_stopped_early_is_not_finished_and_no_turns_means_none():
    s = summarize([rec("a", 1, 0, 10, 20), rec("a", 2, 30, 10, 20)], 1.0, None)
    assert s["sessions_finished"] == 0 and s["session_duration_s"]["median"] is None
    # a trace's sessions: no planned count, every turn in the window completed is finished
    t = summarize([rec("7", 1, 0, 10, 20, of=None), rec("7", 4, 30, 10, 20, of=None)], 1.0, None)
    assert t["sessions_finished"] == 1 and [r["turn"] for r in t["by_turn"]] == [1, 4]
    plain = summarize([rec(None, None, 0, 10, 20, of=None)], 1.0, None)
    assert plain["by_turn"] is None and plain["sessions"] is None
