"""Imports are validated, all-or-nothing and idempotent, and keep every statistic the peers'
files hold; compare treats the OpenAI protocol as one whatever tool spoke it. Real SQLite
stores, files in SGLang's and vLLM's result formats, and generated (hypothesis) inputs: every
generated file either imports whole or is refused whole with a UserError, never a traceback."""

from __future__ import annotations

import json
import math
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servelab.bench.importers import import_file
from servelab.errors import UserError
from servelab.experiment.report.compare import compare
from servelab.store import Store

LINE = {
    "backend": "sglang-oai", "dataset_name": "random", "request_rate": float("inf"),
    "max_concurrency": 8, "random_input_len": 256, "random_output_len": 256, "duration": 20.0,
    "completed": 3, "total_input_tokens": 768, "total_output_tokens": 768,
    "request_throughput": 0.15, "output_throughput": 38.4, "mean_ttft_ms": 120.0,
    "median_ttft_ms": 110.0, "std_ttft_ms": 15.0, "p95_ttft_ms": 160.0, "p99_ttft_ms": 170.0,
    "mean_tpot_ms": 9.3, "median_tpot_ms": 9.2, "p95_tpot_ms": 9.9, "mean_e2e_latency_ms": 2500.0,
    "p95_e2e_latency_ms": 2590.0, "mean_itl_ms": 18.0, "p95_itl_ms": 22.0, "concurrency": 7.9,
    "max_concurrent_requests": 8, "request_goodput": 0.1, "slo_attainment": 0.66,
    "goodput_slos_ms": {"ttft": 2000, "tpot": 100}, "accept_length": 1.9,
    "server_info": {"tp_size": 1, "api_key": "sk-should-not-be-stored", "max_total_tokens": 9},
    "input_lens": [256, 256, 256], "output_lens": [256, 256, 256], "ttfts": [0.1, 0.12, 0.11],
    "itls": [[0.01, 0.02], [0.01], [0.02]], "errors": ["", "", ""],
}


def _file(tmp_path, *objs, name="r.jsonl"):
    f = tmp_path / name
    f.write_text("\n".join(json.dumps(o) for o in objs) + "\n")
    return f


def test_every_statistic_is_kept(tmp_path):
    with Store(tmp_path / "s.db") as st:
        (lp,), before = import_file(st, "sglang", _file(tmp_path, LINE))
        row = st.load_point(lp)
    s = row.summary
    assert not before
    assert s["ttft_ms"]["p95"] == 160.0 and s["tpot_ms"]["p95"] == 9.9
    assert s["e2e_ms"]["p95"] == 2590.0 and s["chunk_gap_ms"]["p95"] == 22.0
    assert s["goodput_req_s"] == 0.1 and s["goodput_slo"] == {"ttft_ms": 2000, "tpot_ms": 100}
    assert s["slo_attainment"] == 0.66
    assert s["measured_concurrency"] == 7.9 and s["peak_concurrency"] == 8
    assert s["failed"] == 0 and s["protocol"] == "openai-completions"
    assert row.provenance["server_info"]["tp_size"] == 1
    assert row.provenance["server_info"]["api_key"] == "<redacted>"


def test_missing_errors_is_unknown_not_none_text(tmp_path, capsys):
    """No `errors` field: failed is unknown (None), shown as '-', not as the word 'None'."""
    from servelab.bench.report import summary_table
    from servelab.console import make_console

    obj = {k: v for k, v in LINE.items() if k not in ("errors", "ttfts", "itls", "input_lens",
                                                       "output_lens")}
    with Store(tmp_path / "s.db") as st:
        (lp,), _ = import_file(st, "sglang", _file(tmp_path, obj))
        s = st.load_point(lp).summary
    assert s["failed"] is None
    make_console(width=200).print(summary_table(s))
    out = capsys.readouterr().out
    assert "3 / -" in out and "None" not in out and "p95" in out


def test_a_bad_second_line_stores_nothing_and_a_reimport_says_so(tmp_path):
    """It used to store the first line, traceback on the second, and duplicate on a re-run."""
    db = tmp_path / "s.db"
    bad = _file(tmp_path, LINE, {**LINE, "itls": "not a list"}, name="bad.jsonl")
    for _ in range(2):
        with Store(db) as st, pytest.raises(UserError, match=r"entry 2 of 2.*'itls'.*nothing"):
            import_file(st, "sglang", bad)
        with Store(db) as st:
            assert st.load_points() == []
            assert not list(st.requests_dir.glob("*.gz"))
    good = _file(tmp_path, LINE, {**LINE, "max_concurrency": 16}, name="good.jsonl")
    with Store(db) as st:
        ids, before = import_file(st, "sglang", good)
        again, before2 = import_file(st, "sglang", good)
        assert len(ids) == 2 and not before and before2 and again == ids
        assert len(st.load_points()) == 2


@pytest.mark.parametrize("field,value,word", [
    ("itls", "x", "'itls'"),
    ("input_lens", 5, "'input_lens'"),
    ("completed", 10**30, "'completed'"),
    ("completed", "lots", "'completed'"),
    ("model_id", ["a"], "'model_id'"),
    ("duration", -3.0, "'duration'"),
    ("mean_ttft_ms", -1.0, "'mean_ttft_ms'"),
    ("output_throughput", float("inf"), "'output_throughput'"),
    ("ttfts", [0.1, 0.2], "has 2"),  # per-request lists of different lengths
    ("server_info", "x", "'server_info'"),
])
def test_findings_are_refused_with_one_line(tmp_path, field, value, word):
    with Store(tmp_path / "s.db") as st:
        with pytest.raises(UserError) as exc:
            import_file(st, "sglang", _file(tmp_path, {**LINE, field: value}))
        assert word in str(exc.value) and "\n" not in str(exc.value)
        assert st.load_points() == []


def test_blank_error_messages_count_as_failures(tmp_path):
    """`"errors": [" ", "", ""]` used to traceback (an IndexError on a blank message)."""
    with Store(tmp_path / "s.db") as st:
        (lp,), _ = import_file(st, "sglang", _file(tmp_path, {**LINE, "errors": [" ", "", ""]}))
        s = st.load_point(lp).summary
    assert s["failed"] == 1 and s["failure_reasons"] == {"(no message)": 1}


def test_compare_openai_protocol_results_without_a_tool_warning(tmp_path):
    """vLLM's backend 'vllm' and servelab's api 'completions' are one protocol: no warning."""
    vllm = {k: v for k, v in LINE.items() if k not in ("backend",)}
    vllm.update(backend="vllm", model_id="m")
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps({"load_points": [{
        "load_key": "c=8", "api": "completions", "output_throughput_tok_s": 40.0,
        "dataset": "random", "input_len": 256, "output_len": 256}]}))
    with Store(tmp_path / "s.db") as st:
        (lp,), _ = import_file(st, "vllm", _file(tmp_path, vllm, name="v.json"))
        res = compare(st, str(lp), str(ours))
        assert not any("protocol" in w or "api" in w for w in res.warnings), res.warnings
        chat = tmp_path / "chat.json"
        chat.write_text(ours.read_text().replace('"completions"', '"chat"'))
        assert any("protocol differs" in w for w in compare(st, str(lp), str(chat)).warnings)


@pytest.mark.parametrize("band", [-1.0, math.nan, math.inf, 1.5])
def test_compare_noise_band_is_validated(tmp_path, band):
    """-1 turned a 'better' into 'worse'; NaN turned +21% into 'within noise'."""
    with Store(tmp_path / "s.db") as st:
        (lp,), _ = import_file(st, "sglang", _file(tmp_path, LINE))
        with pytest.raises(UserError, match="--noise-band"):
            compare(st, str(lp), str(lp), noise_band=band)


# ---- generated inputs ---------------------------------------------------------------------------

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=8)


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(changes=st.dictionaries(st.sampled_from(sorted(LINE)), json_values, max_size=4),
       kind=st.sampled_from(["sglang", "vllm"]), extra_line=st.booleans())
def test_generated_files_import_whole_or_not_at_all(tmp_path, changes, kind, extra_line):
    db = tmp_path / f"gen-{uuid.uuid4().hex}.db"  # tmp_path is shared by the examples
    objs = [LINE, {**LINE, **changes}] if extra_line else [{**LINE, **changes}]
    f = _file(tmp_path, *objs, name="gen.jsonl")
    with Store(db) as st:
        try:
            ids, _ = import_file(st, kind, f)
        except UserError as exc:
            assert "\n" not in str(exc)
            assert st.load_points() == [], "a refused file left rows behind"
            return
        assert len(ids) == len(objs) == len(st.load_points())
        for lp in ids:
            s = st.load_point(lp).summary
            assert s["duration_s"] > 0 and isinstance(s["completed"], int)
            for m in ("ttft_ms", "tpot_ms", "e2e_ms", "chunk_gap_ms"):
                assert all(v is None or (math.isfinite(v) and v >= 0) for v in s[m].values())
