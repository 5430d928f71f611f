"""Store rows, `servelab results list|show`, `servelab import sglang|vllm` with small files in
those tools' formats (field names as sglang/bench_serving.py and vllm/benchmarks/serve.py write
them), and the contract keys of the summary."""

from __future__ import annotations

import json

import orjson
import pytest
from cli_inproc import cli

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.run import run_load_point, save_load_point
from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script
from servelab.store import Store

CONTRACT = ("ttft_ms", "tpot_ms", "itl_ms", "chunk_gap_ms", "e2e_ms", "output_throughput_tok_s",
            "input_throughput_tok_s", "total_throughput_tok_s", "request_throughput_req_s",
            "goodput_req_s", "completed", "failed", "failure_reasons", "accept_length",
            "accept_length_source", "duration_s", "input_len_exact", "load_key", "concurrency",
            "request_rate")




def test_save_list_show(monkeypatch, capsys, tmp_path):
    with serve_in_thread(Script(ttft_ms=2, gap_ms=1, flavor="sglang")) as h:
        cfg = BenchConfig(base_url=h.url, workload=WorkloadConfig(input_len=5, output_len=4,
                                                                  num_prompts=5, seed=9))
        load = LoadPoint(concurrency=2)
        res = run_load_point(cfg, load, progress=True)
    for k in CONTRACT:
        assert k in res.summary, k
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "chunk_gap_ms", "e2e_ms"):
        assert set(res.summary[m]) == {"mean", "median", "p90", "p95", "p99", "std"}
    assert "get_server_info" in res.server_info and "v1_models" in res.server_info
    db = tmp_path / "r.db"
    with Store(db) as st:
        lp = save_load_point(st, cfg, load, res, label="mine")
        row = st.load_point(lp)
        assert row.summary == orjson.loads(orjson.dumps(res.summary))
        assert row.provenance["workload_seed"] == 9
        assert row.provenance["server_info"]["get_server_info"]["model_path"] == "scripted-model"
        assert len(list(st.requests(row))) == 5
    code, out, _ = cli(monkeypatch, capsys, "results", "list", "--store", str(db))
    assert code == 0 and "mine" in out and "c=2" in out
    code, out, _ = cli(monkeypatch, capsys, "results", "list", "--source", "import:vllm",
                       "--store", str(db))
    assert code == 0 and "no load points with source 'import:vllm'" in out
    code, out, _ = cli(monkeypatch, capsys, "results", "show", str(lp), "--json", "--requests",
                       "--store", str(db))
    doc = json.loads(out)
    assert doc["summary"]["completed"] == 5 and len(doc["requests"]) == 5
    code, out, _ = cli(monkeypatch, capsys, "results", "show", str(lp), "--store", str(db))
    assert code == 0 and "TTFT" in out
    code, _, err = cli(monkeypatch, capsys, "results", "show", "999", "--store", str(db))
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_bench_cli_stores_and_writes_output(monkeypatch, capsys, tmp_path):
    out_file = tmp_path / "sub" / "out.json"
    with serve_in_thread(Script(ttft_ms=2, gap_ms=1)) as h:
        code, out, err = cli(monkeypatch, capsys, "bench", "--base-url", h.url, "--concurrency", "1,3",
                             "--num-prompts", "4", "--input-len", "6", "--output-len", "5",
                             "--goodput", "ttft_ms=1000", "--quiet", "--output", str(out_file))
    assert code == 0, err
    doc = orjson.loads(out_file.read_bytes())
    assert [lp["load_key"] for lp in doc["load_points"]] == ["c=1", "c=3"]
    assert all(lp["goodput_req_s"] == pytest.approx(lp["request_throughput_req_s"])
               for lp in doc["load_points"])
    assert doc["provenance"]["servelab_version"]
    with Store() as st:
        assert [r.load_key for r in st.load_points()] == ["c=3", "c=1"]


SGLANG_LINE = {
    "backend": "sglang", "dataset_name": "random", "request_rate": float("inf"),
    "max_concurrency": 8, "sharegpt_output_len": None, "random_input_len": 256,
    "random_output_len": 256, "random_range_ratio": 1.0, "duration": 20.0, "completed": 64,
    "total_input_tokens": 16384, "total_output_tokens": 16384,
    "total_output_tokens_retokenized": 16380, "request_throughput": 3.2, "input_throughput": 819.2,
    "output_throughput": 819.2, "mean_e2e_latency_ms": 2500.0, "median_e2e_latency_ms": 2490.0,
    "std_e2e_latency_ms": 40.0, "p99_e2e_latency_ms": 2600.0, "mean_ttft_ms": 120.0,
    "median_ttft_ms": 110.0, "std_ttft_ms": 15.0, "p99_ttft_ms": 170.0, "mean_tpot_ms": 9.3,
    "median_tpot_ms": 9.2, "std_tpot_ms": 0.4, "p99_tpot_ms": 10.1, "mean_itl_ms": 18.0,
    "median_itl_ms": 17.5, "std_itl_ms": 3.0, "p95_itl_ms": 22.0, "p99_itl_ms": 30.0,
    "concurrency": 7.9, "accept_length": 1.93,
}

VLLM_RESULT = {
    "date": "20261129-120000", "backend": "vllm", "model_id": "deepseek-ai/DeepSeek-V4-Flash",
    "tokenizer_id": "deepseek-ai/DeepSeek-V4-Flash", "num_prompts": 3, "request_rate": 4.0,
    "burstiness": 1.0, "max_concurrency": None, "duration": 3.0, "completed": 2, "failed": 1,
    "total_input_tokens": 512, "total_output_tokens": 20, "request_throughput": 0.667,
    "request_goodput": 0.333, "output_throughput": 6.67, "total_token_throughput": 177.3,
    "input_lens": [256, 256, 256], "output_lens": [10, 10, 0], "ttfts": [0.1, 0.2, 0.0],
    "itls": [[0.01] * 9, [0.02] * 9, []], "generated_texts": ["a", "b", ""],
    "errors": ["", "", "Traceback ...\naiohttp.ClientConnectionError: boom"],
    "mean_ttft_ms": 150.0, "median_ttft_ms": 150.0, "std_ttft_ms": 50.0, "p99_ttft_ms": 199.0,
    "mean_tpot_ms": 15.0, "median_tpot_ms": 15.0, "std_tpot_ms": 5.0, "p99_tpot_ms": 19.9,
    "mean_itl_ms": 15.0, "median_itl_ms": 15.0, "std_itl_ms": 5.0, "p99_itl_ms": 20.0,
    "mean_e2el_ms": 300.0, "median_e2el_ms": 300.0, "std_e2el_ms": 50.0, "p99_e2el_ms": 349.0,
    "spec_decode_acceptance_rate": 62.5, "spec_decode_acceptance_length": 2.25,
}


def test_import_sglang_jsonl(monkeypatch, capsys, tmp_path):
    second = dict(SGLANG_LINE, max_concurrency=None, request_rate=4.0, accept_length=None)
    f = tmp_path / "sglang.jsonl"
    f.write_text(json.dumps(SGLANG_LINE) + "\n" + json.dumps(second) + "\n")  # has Infinity
    code, out, err = cli(monkeypatch, capsys, "import", "sglang", str(f))
    assert code == 0, err
    with Store() as st:
        rows = st.load_points(source="import:sglang")
    assert len(rows) == 2
    s = {r.load_key: r.summary for r in rows}
    a, b = s["c=8"], s["rate=4"]
    assert a["ttft_ms"] == {"mean": 120.0, "median": 110.0, "p90": None, "p95": None, "p99": 170.0, "std": 15.0}
    assert a["e2e_ms"]["p99"] == 2600.0 and a["tpot_ms"]["median"] == 9.2
    assert a["chunk_gap_ms"]["mean"] == 18.0 and a["itl_ms"]["mean"] is None  # their ITL is per chunk
    assert a["output_throughput_tok_s"] == 819.2 and a["request_throughput_req_s"] == 3.2
    assert a["total_throughput_tok_s"] == pytest.approx(32768 / 20)
    assert a["accept_length"] == 1.93 and a["accept_length_source"] == "metrics:sglang"
    assert a["concurrency"] == 8 and a["request_rate"] is None and a["goodput_req_s"] is None
    assert b["accept_length"] is None and b["accept_length_source"] is None
    assert b["request_rate"] == 4.0 and b["concurrency"] is None


def test_import_vllm_json(monkeypatch, capsys, tmp_path):
    f = tmp_path / "vllm.json"
    f.write_text(json.dumps(VLLM_RESULT, indent=2))
    code, out, err = cli(monkeypatch, capsys, "import", "vllm", str(f), "--label", "v")
    assert code == 0, err
    with Store() as st:
        (row,) = st.load_points(source="import:vllm")
        recs = list(st.requests(row))
    s = row.summary
    assert row.label == "v" and row.load_key == "rate=4" and row.model == VLLM_RESULT["model_id"]
    assert s["e2e_ms"]["p99"] == 349.0 and s["ttft_ms"]["std"] == 50.0
    assert s["chunk_gap_ms"]["median"] == 15.0 and s["itl_ms"]["median"] is None
    assert s["completed"] == 2 and s["failed"] == 1
    assert s["failure_reasons"] == {"aiohttp.ClientConnectionError: boom": 1}
    assert s["goodput_req_s"] == 0.333 and s["total_throughput_tok_s"] == 177.3
    assert s["accept_length"] == 2.25 and s["accept_length_source"] == "metrics:vllm"
    assert s["accept_rate"] == pytest.approx(0.625)
    assert recs[0]["ttft_ms"] == pytest.approx(100.0) and recs[2]["ok"] is False
    assert recs[1]["chunk_gap_ms"] == pytest.approx([20.0] * 9)
    assert recs[1]["tpot_ms"] == pytest.approx(20.0)
    code, out, err = cli(monkeypatch, capsys, "results", "show", str(row.id))
    assert code == 0 and "imported" in out and "20261129-120000" in out and "measured" not in out


def test_import_rejects_other_files(monkeypatch, capsys, tmp_path):
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"hello": 1}))
    code, _, err = cli(monkeypatch, capsys, "import", "vllm", str(f))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not a vllm" in err
    code, _, err = cli(monkeypatch, capsys, "import", "sglang", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "no such file" in err
