"""AIPerf 0.13.0's own profile export + per-request JSONL (data/README.md) import with the
TTFT / ITL its console printed, within the console's rounding; genai-perf's export, which
could not be installed here (it needs Triton's perf_analyzer binary), is built from its
documented layout (genai_perf/export_data/json_exporter.py: the statistics per metric,
`{unit, avg, min, max, std, pN}`, plus `input_config`, its arguments)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from servelab.bench.importers import import_file
from servelab.errors import UserError
from servelab.store import Store

DATA = Path(__file__).parent / "data"
PREFIX = "aiperf-0.13.0-c4."


def _artifacts(tmp: Path, jsonl: bool = True) -> Path:
    """The tool's artifact folder as it wrote it: the two files under their own names."""
    d = tmp / "artifacts"
    d.mkdir(exist_ok=True)
    for name in ("profile_export_aiperf.json",) + (("profile_export.jsonl",) if jsonl else ()):
        (d / name).write_bytes(gzip.decompress((DATA / (PREFIX + name + ".gz")).read_bytes()))
    return d / "profile_export_aiperf.json"


def _console(metric: str) -> dict[str, float]:
    """A row of their 'LLM Metrics' table: {avg, min, max, p99, p90, p50, std}."""
    text = gzip.decompress((DATA / (PREFIX + "console.txt.gz")).read_bytes()).decode()
    table = text[text.index("NVIDIA AIPerf | LLM Metrics\n") if "NVIDIA AIPerf | LLM Metrics\n"
                 in text else text.rindex("LLM Metrics"):]
    for line in table.splitlines():
        if metric in line:
            nums = [float(x.replace(",", "")) for x in re.findall(r"[\d,]+\.\d+", line)]
            return dict(zip(("avg", "min", "max", "p99", "p90", "p50", "std"), nums, strict=True))
    raise AssertionError(f"{metric} not in their console")


def test_aiperf_round_trips_against_its_console(tmp_path):
    f = _artifacts(tmp_path)
    with Store(tmp_path / "s.db") as st:
        ids, before = import_file(st, "aiperf", f)
        assert len(ids) == 1 and not before
        lp = st.load_point(ids[0])
        reqs = list(st.requests(lp))
    s = lp.summary
    ttft, itl = _console("Time to First Token (ms)"), _console("Inter Token Latency (ms)")
    e2e = _console("Request Latency (ms)")
    for ours, theirs in ((s["ttft_ms"], ttft), (s["tpot_ms"], itl), (s["e2e_ms"], e2e)):
        for our_key, their_key in (("mean", "avg"), ("median", "p50"), ("p90", "p90"),
                                   ("p99", "p99"), ("min", "min"), ("max", "max"), ("std", "std")):
            assert abs(ours[our_key] - theirs[their_key]) <= 0.005 + 1e-9, (our_key, ours, theirs)
    assert lp.load_key == "c=4" and s["completed"] == 22 and s["failed"] == 2
    assert s["failure_reasons"] == {"http_500": 2} and s["protocol"] == "openai-chat"
    assert abs(s["output_throughput_tok_s"] - 547.00) < 0.005
    # per request (the JSONL): 24 rows, 2 failed, and their ITL is (E2E - TTFT) / (n - 1)
    assert len(reqs) == 24 and [r["error"] for r in reqs if not r["ok"]] == ["http_500"] * 2
    for r in reqs:
        if r["ok"]:
            assert abs(r["tpot_ms"] - (r["e2e_ms"] - r["ttft_ms"]) / (r["output_tokens"] - 1)) \
                < 0.02 * r["tpot_ms"], r
            assert len(r["chunk_gap_ms"]) >= r["output_tokens"] - 1


def test_the_jsonl_is_part_of_the_import(tmp_path):
    """Without the JSONL the summary still imports (no records); adding it later is a new
    import (the hash covers both files), not 'imported before'."""
    f = _artifacts(tmp_path, jsonl=False)
    with Store(tmp_path / "s.db") as st:
        ids, _ = import_file(st, "aiperf", f)
        assert list(st.requests(st.load_point(ids[0]))) == []
        _artifacts(tmp_path, jsonl=True)
        ids2, before = import_file(st, "aiperf", f)
        assert not before and ids2 != ids
        _, before = import_file(st, "aiperf", f)
        assert before


def test_a_bad_jsonl_line_refuses_everything(tmp_path):
    f = _artifacts(tmp_path)
    j = f.with_name("profile_export.jsonl")
    lines = j.read_text().splitlines()
    row = json.loads(lines[5])
    row["metrics"]["time_to_first_token"]["unit"] = "fortnights"
    lines[5] = json.dumps(row)
    j.write_text("\n".join(lines))
    with Store(tmp_path / "s.db") as st:
        with pytest.raises(UserError, match="line 6: time_to_first_token: .*unit.*nothing"):
            import_file(st, "aiperf", f)
        assert st.load_points() == []


def _stat(unit: str, avg: float, **pcts: float) -> dict:
    return {"unit": unit, "avg": avg, **pcts}


GENAI_PERF = {  # the layout of genai-perf's exporter; values chosen so the arithmetic is checkable
    "request_throughput": {"unit": "requests/sec", "avg": 4.0},
    "request_latency": _stat("ms", 1100.0, p50=1000.0, p90=1500.0, p99=1900.0, min=900.0,
                             max=2000.0, std=50.0),
    "time_to_first_token": _stat("ms", 100.0, p50=90.0, p90=150.0, p99=190.0),
    "inter_token_latency": _stat("ms", 10.0, p50=9.5, p90=12.0, p99=14.0),
    "output_token_throughput": {"unit": "tokens/sec", "avg": 404.0},
    "output_sequence_length": _stat("tokens", 101.0, p50=101.0),
    "input_sequence_length": _stat("tokens", 200.0, p50=200.0),
    "request_count": {"unit": "count", "avg": 40},
    "input_config": {"model": ["llama-3-8b"], "endpoint_type": "chat", "service_kind": "openai",
                     "concurrency": 4, "request_rate": None, "streaming": True},
}


def test_genai_perf_from_its_documented_layout(tmp_path):
    f = tmp_path / "profile_export_genai_perf.json"
    f.write_text(json.dumps(GENAI_PERF))
    with Store(tmp_path / "s.db") as st:
        ids, _ = import_file(st, "genai-perf", f)
        lp = st.load_point(ids[0])
    s = lp.summary
    assert lp.load_key == "c=4" and lp.model == "llama-3-8b" and s["protocol"] == "openai-chat"
    assert s["tpot_ms"]["mean"] == 10.0 and s["tpot_ms"]["median"] == 9.5  # their ITL
    assert s["e2e_ms"]["p90"] == 1500.0 and s["ttft_ms"]["p99"] == 190.0
    assert s["duration_s"] == 10.0  # 40 requests at 4 req/s: genai-perf writes no duration
    assert s["failed"] is None  # genai-perf does not say: unknown, not 0
    assert s["e2e_ms"]["p95"] is None  # not written: missing, not 0


def test_genai_perf_units_are_read_not_assumed(tmp_path):
    doc = json.loads(json.dumps(GENAI_PERF))
    doc["time_to_first_token"] = _stat("sec", 0.1, p50=0.09)
    f = tmp_path / "g.json"
    f.write_text(json.dumps(doc))
    with Store(tmp_path / "s.db") as st:
        s = st.load_point(import_file(st, "genai-perf", f)[0][0]).summary
    assert s["ttft_ms"]["mean"] == pytest.approx(100.0) and s["ttft_ms"]["median"] == \
        pytest.approx(90.0)
    doc["time_to_first_token"]["unit"] = "parsecs"
    f.write_text(json.dumps(doc))
    with Store(tmp_path / "t.db") as st, pytest.raises(UserError, match="time unit"):
        import_file(st, "genai-perf", f)


def test_a_file_of_another_tool_is_named_as_such(tmp_path):
    f = tmp_path / "x.json"
    f.write_text(json.dumps(GENAI_PERF))
    with Store(tmp_path / "s.db") as st, pytest.raises(UserError, match="aiperf_version"):
        import_file(st, "aiperf", f)


def test_genai_perf_file_written_by_its_own_code(tmp_path):
    """genai-perf 0.0.16's own Statistics and config over AIPerf's 22 measured requests (its
    perf_analyzer binary, which takes the timestamps, is not on PyPI; data/README.md): the
    import reads its numbers exactly, and agrees with AIPerf's import of the same requests."""
    f = tmp_path / "profile_export_genai_perf.json"
    raw = gzip.decompress((DATA / "genai-perf-0.0.16-c4.profile_export_genai_perf.json.gz")
                          .read_bytes())
    f.write_bytes(raw)
    theirs = json.loads(raw)
    with Store(tmp_path / "s.db") as st:
        g = st.load_point(import_file(st, "genai-perf", f)[0][0])
        a = st.load_point(import_file(st, "aiperf", _artifacts(tmp_path))[0][0])
    s = g.summary
    assert g.load_key == "c=4" and g.model == "scripted-model" and s["protocol"] == "openai-chat"
    for ours, name in (("ttft_ms", "time_to_first_token"), ("tpot_ms", "inter_token_latency"),
                       ("e2e_ms", "request_latency")):
        assert s[ours]["mean"] == theirs[name]["avg"] and s[ours]["p99"] == theirs[name]["p99"]
        # the same requests through two tools' statistics: the same numbers
        assert s[ours]["mean"] == pytest.approx(a.summary[ours]["mean"], rel=1e-3), ours
    assert s["completed"] == 22
    assert s["duration_s"] == pytest.approx(22 / theirs["request_throughput"]["avg"])
