"""`--json` on the CLI verbs (servelab/jsonout.py, docs/JSON.md): stdout is exactly one JSON
document with its schema tag, and its numbers are the ones stored or written elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_inproc import cli

from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script
from servelab.store import Store

FIXTURES = Path(__file__).parent / "profile" / "fixtures"




def test_bench_results_and_compare_print_one_document(monkeypatch, capsys, tmp_path):
    db = str(tmp_path / "r.db")
    with serve_in_thread(Script(ttft_ms=2, gap_ms=1)) as h:
        code, out, err = cli(monkeypatch, capsys, "bench", "--base-url", h.url, "--concurrency",
                             "1,2", "--num-prompts", "4", "--input-len", "4", "--output-len", "3",
                             "--store", db, "--json")
    assert code == 0, err
    doc = json.loads(out)  # the whole of stdout: the tables went to stderr
    assert doc["schema"] == "servelab.bench/1" and doc["sweep"] is None
    assert "TTFT" in err
    ids = [p["store_id"] for p in doc["load_points"]]
    with Store(db) as st:
        for p in doc["load_points"]:
            stored = st.load_point(p["store_id"]).summary
            assert p["ttft_ms"] == stored["ttft_ms"] and p["completed"] == stored["completed"] == 4
    code, out, _ = cli(monkeypatch, capsys, "results", "list", "--store", db, "--json")
    listed = json.loads(out)
    assert listed["schema"] == "servelab.load_points/1"
    assert sorted(r["id"] for r in listed["load_points"]) == sorted(ids)
    code, out, _ = cli(monkeypatch, capsys, "results", "show", str(ids[0]), "--store", db, "--json")
    shown = json.loads(out)
    assert shown["schema"] == "servelab.load_point/1" and shown["concurrency"] == 1
    code, out, _ = cli(monkeypatch, capsys, "compare", str(ids[0]), str(ids[1]), "--store", db,
                       "--json")
    cmp = json.loads(out)
    assert cmp["schema"] == "servelab.compare/1" and cmp["noise_band"] == 0.02
    row = next(r for r in cmp["rows"] if r["metric"].startswith("output throughput"))
    a = doc["load_points"][0]["output_throughput_tok_s"]
    assert row["a"] == pytest.approx(a, rel=1e-3)  # printed to 4 significant digits


def test_bad_input_with_json_is_still_one_error_line(monkeypatch, capsys, tmp_path):
    code, out, err = cli(monkeypatch, capsys, "results", "show", "999", "--store",
                         str(tmp_path / "r.db"), "--json")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


def test_status_json_lists_jobs(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SERVELAB_HOME", str(tmp_path))
    from servelab.jobs import Job

    job = Job("exp1", "experiment", total=4)
    job.update(done=3, failed=1, current="arm b, c=1, rep 2")
    job.finish("interrupted")
    code, out, _ = cli(monkeypatch, capsys, "status", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["schema"] == "servelab.jobs/1"
    (j,) = doc["jobs"]
    assert (j["name"], j["done"], j["failed"], j["state"]) == ("exp1", 3, 1, "interrupted")
    assert j["eta_s"] is None and j["elapsed_s"] >= 0


def test_profile_and_ceiling_json_to_stdout_match_the_file(monkeypatch, capsys, tmp_path):
    # bare --json prints the document on stdout (tables on stderr), as every other verb does;
    # --output-file writes the same document
    trace = str(FIXTURES / "eager_small.json.gz")
    f = tmp_path / "p.json"
    code, out, err = cli(monkeypatch, capsys, "profile", trace, "--output-file", str(f))
    assert code == 0 and "wrote" in out and "steps" in out  # the tables, then the file's name
    code, out, err = cli(monkeypatch, capsys, "profile", trace, "--json")
    doc = json.loads(out)
    assert code == 0 and doc.pop("schema") == "servelab.profile/1" and "steps" in err
    want = json.loads(f.read_text())
    assert want.pop("schema") == "servelab.profile/1"
    for k in ("steps", "categories", "top_kernels", "gpu_busy_us"):  # provenance differs (time)
        assert doc[k] == want[k]
    g = tmp_path / "c.json"
    code, out, err = cli(monkeypatch, capsys, "ceiling", "--model", "llama-3.1-8b", "--gpu",
                         "h200", "--batch", "1,8", "--json", "--output-file", str(g))
    doc = json.loads(out)
    assert code == 0 and doc["schema"] == "servelab.ceiling/1" and set(doc["tok_s"]) == {"1", "8"}
    assert "tok/s" in err and "wrote" in err  # the table and the note, off stdout
    assert json.loads(g.read_text()) == doc
    # the old spelling names the fix instead of writing a file called '-'
    code, out, err = cli(monkeypatch, capsys, "ceiling", "--model", "llama-3.1-8b", "--gpu",
                         "h200", "--json", "-")
    assert code == 2 and not out and "--output-file FILE" in err and len(err.splitlines()) == 1


def test_tune_verify_document_and_non_finite_numbers():
    from servelab import jsonout
    from servelab.tune.verify import FileCheck, VerifyRow

    row = VerifyRow(128, 256, 2, "m16n64k128g1w4s2", 10.0, 15.0, float("nan"))
    chk = FileCheck(Path("/x/N=128,K=256.json"), "sglang", 128, 256, "H200", {1: {}, 64: {}}, (2,))
    doc = json.loads(jsonout.dumps(jsonout.document(
        "tune_verify", jsonout.tune_verify([chk], [row], "H200", None))))
    assert doc["schema"] == "servelab.tune_verify/1" and doc["geomean_speedup"] is None
    assert doc["rows"][0]["speedup"] == 1.5 and doc["rows"][0]["tflops"] is None  # NaN: null
    assert doc["files"][0] == {"path": "/x/N=128,K=256.json", "format": "sglang", "n": 128,
                               "k": 256, "tuned_on": "H200", "batch_sizes": [1, 64],
                               "missing_default": [2]}
    with pytest.raises(ValueError):
        jsonout.document("nope", {})


def test_import_json_names_the_stored_rows(monkeypatch, capsys, tmp_path):
    # a vLLM `bench serve --save-result` file of one request
    result = {"date": "20261201-120000", "backend": "vllm", "model_id": "m", "num_prompts": 1,
              "request_rate": 2.0, "burstiness": 1.0, "max_concurrency": None, "duration": 1.0,
              "completed": 1, "failed": 0, "total_input_tokens": 8, "total_output_tokens": 3,
              "request_throughput": 1.0, "output_throughput": 3.0,
              "total_token_throughput": 11.0, "input_lens": [8], "output_lens": [3],
              "ttfts": [0.05], "itls": [[0.01, 0.01]], "generated_texts": ["abc"], "errors": [""],
              "mean_ttft_ms": 50.0, "median_ttft_ms": 50.0, "std_ttft_ms": 0.0, "p99_ttft_ms": 50.0,
              "mean_tpot_ms": 10.0, "median_tpot_ms": 10.0, "std_tpot_ms": 0.0, "p99_tpot_ms": 10.0,
              "mean_itl_ms": 10.0, "median_itl_ms": 10.0, "std_itl_ms": 0.0, "p99_itl_ms": 10.0,
              "mean_e2el_ms": 70.0, "median_e2el_ms": 70.0, "std_e2el_ms": 0.0,
              "p99_e2el_ms": 70.0}
    f = tmp_path / "v.json"
    f.write_text(json.dumps(result))
    db = str(tmp_path / "r.db")
    code, out, err = cli(monkeypatch, capsys, "import", "vllm", str(f), "--store", db, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema"] == "servelab.import/1" and doc["kind"] == "vllm"
    with Store(db) as st:
        assert [r.id for r in st.load_points(source="import:vllm")] == doc["load_point_ids"]
