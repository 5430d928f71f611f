"""Trace files: each format read with its own columns and units, the window, speed and cap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.bench.datasets.trace import azure_seconds, detect_format, read_window
from servelab.errors import UserError

SAMPLES = Path(__file__).resolve().parents[3] / "examples" / "traces"


@pytest.mark.parametrize("name,fmt", [("mooncake_sample.jsonl", "mooncake"),
                                      ("bailian_sample.jsonl", "bailian"),
                                      ("azure_sample.csv", "azure"),
                                      ("burstgpt_sample.csv", "burstgpt")])
def test_every_sample_is_detected_and_read(name, fmt):
    w = read_window(str(SAMPLES / name))
    assert detect_format(str(SAMPLES / name)) == fmt == w.format
    assert w.arrivals_s[0] == 0.0 and list(w.arrivals_s) == sorted(w.arrivals_s)
    assert 5 < w.arrivals_s[-1] < 30  # about 20 s at speed 1: units read right (not ms as s)
    assert len(set(w.arrivals_s)) < len(w.arrivals_s)  # bursts: requests sharing a time


def test_units_mooncake_ms_bailian_s(tmp_path):
    mc, bl = tmp_path / "m.jsonl", tmp_path / "b.jsonl"
    mc.write_text("".join(json.dumps({"timestamp": t, "input_length": 5, "output_length": 2,
                                      "hash_ids": [0]}) + "\n" for t in (1000, 3500)))
    bl.write_text("".join(json.dumps({"chat_id": i, "parent_chat_id": -1, "timestamp": t,
                                      "input_length": 5, "output_length": 2, "type": "text",
                                      "turn": 1, "hash_ids": [i]}) + "\n"
                          for i, t in enumerate((1.0, 3.5))))
    assert read_window(str(mc)).arrivals_s == (0.0, 2.5)
    assert read_window(str(bl)).arrivals_s == (0.0, 2.5)


def test_azure_keeps_100ns_and_offsets():
    a = azure_seconds("2023-11-16 18:17:03.9799600")
    b = azure_seconds("2023-11-16 18:17:03.9799601")
    assert b - a == pytest.approx(1e-7, abs=2e-8)
    assert azure_seconds("2024-05-10 02:00:00.5+02:00") == azure_seconds("2024-05-10 00:00:00.5")


def test_burstgpt_failed_rows_are_skipped():
    w = read_window(str(SAMPLES / "burstgpt_sample.csv"))
    assert w.skipped == 1 and len(w.rows) == w.read - 1
    assert all(r.output_len > 0 for r in w.rows)


def test_window_speed_and_cap(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps({"timestamp": 1000 * t, "input_length": 5, "output_length": 2,
                                     "hash_ids": [t]}) + "\n" for t in range(10)))
    w = read_window(str(p), start_s=2, duration_s=5, speed=2.0)
    assert [r.t_s for r in w.rows] == [2, 3, 4, 5, 6] and w.arrivals_s == (0, 0.5, 1, 1.5, 2)
    w = read_window(str(p), start_s=2, cap=3)
    assert [r.t_s for r in w.rows] == [2, 3, 4] and w.read == 5  # stopped once the cap was met
    with pytest.raises(UserError, match="no request in the window"):
        read_window(str(p), start_s=100)


def test_unknown_files_say_what_is_expected(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="Azure CSV"):
        read_window(str(p))


def test_broken_rows_are_refused_in_one_line_and_empty_ones_skipped(tmp_path):
    p = tmp_path / "t.jsonl"
    rows = [{"timestamp": 0, "input_length": 5, "output_length": 2},
            {"timestamp": 1, "input_length": 0, "output_length": 2},  # nothing to send: skipped
            {"timestamp": 2, "input_length": 5, "output_length": 2}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = read_window(str(p))
    assert len(w.rows) == 2 and w.skipped == 1
    p.write_text(json.dumps({"timestamp": 0, "input_length": 10**12, "output_length": 2}) + "\n")
    with pytest.raises(UserError, match="token counts within"):
        read_window(str(p))
    c = tmp_path / "b.csv"
    c.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "nan,GPT-4,5,5,10,API log\n")
    with pytest.raises(UserError, match="must be finite"):
        read_window(str(c))
