"""`servelab bench --save-result` writes vLLM's own result file: vLLM's key set, units and file
names, numbers equal to servelab's --output document, statistics that vLLM's calculate_metrics
would compute from the file's own per-request lists, and servelab's vLLM importer reads it back
to the same TTFT/TPOT/throughput. Against the scripted server (loopback, in a thread)."""

from __future__ import annotations

import contextlib
import io
import json
import re

import numpy as np
import pytest
from cli_inproc import cli

from servelab.bench.importers import vllm_layout
from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script
from servelab.store import Store

# The keys `vllm bench serve --save-result` writes for a generative model with a tokenizer,
# no ramp-up, no probe, no speculative decoding: vllm/benchmarks/serve.py at commit
# 009e6d4a1cd6 (vLLM main, late 2026), main_async() + benchmark().
VLLM_KEYS = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id",
             "num_prompts", "request_rate", "burstiness", "max_concurrency", "duration",
             "completed", "failed", "total_input_tokens", "total_output_tokens",
             "request_throughput", "request_goodput", "output_throughput",
             "total_token_throughput", "latencies", "queue_times", "max_output_tokens_per_s",
             "max_concurrent_requests", "rtfx"}
# the scripted server (vLLM flavour, 2 tokens a chunk) reports vLLM's spec_decode counters: then
VLLM_SPEC_KEYS = {"spec_decode_acceptance_rate", "spec_decode_acceptance_length",
                  "spec_decode_num_drafts", "spec_decode_draft_tokens",
                  "spec_decode_accepted_tokens", "spec_decode_per_position_acceptance_rates"}
VLLM_DETAIL_KEYS = {"input_lens", "output_lens", "ttfts", "itls", "start_times",
                    "generated_texts", "errors"}  # kept only with --save-detailed


def vllm_stat_keys(metrics, percentiles):
    return {f"{s}_{m}_ms" for m in metrics for s in ("mean", "median", "std", *percentiles)}


NAME = re.compile(r"openai-infqps-concurrency(\d)-scripted-model-\d{8}-\d{6}\.json")


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """One bench call, two closed-loop points, some requests failing: vLLM's files, detailed,
    beside servelab's --output document; then the same loads appended to one file."""
    d = tmp_path_factory.mktemp("vllm")
    mp = pytest.MonkeyPatch()
    mp.setenv("SERVELAB_HOME", str(d / "home"))
    cap = _Capture()
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(cap.out))
    stack.enter_context(contextlib.redirect_stderr(cap.err))
    base = ["--concurrency", "1,3", "--num-prompts", "9", "--input-len", "6", "--output-len",
            "5", "--quiet", "--no-store", "--scrape-interval", "0"]
    with serve_in_thread(Script(ttft_ms=8, gap_ms=2, tokens_per_chunk=2, fail_rate=0.25, seed=5)) as h:
        code, out, err = cli(mp, cap, "bench", "--base-url", h.url, *base, "--goodput",
                             "ttft:500", "--save-result", "--save-detailed", "--result-dir",
                             str(d / "res"), "--output", str(d / "ours.json"), "--metadata",
                             "tp=1 version=x", "--percentile-metrics", "ttft,tpot,itl,e2el",
                             "--metric-percentiles", "50,90,99")
        assert code == 0, err
        code2, _, err2 = cli(mp, cap, "bench", "--base-url", h.url, *base, "--append-result",
                             "--result-dir", str(d / "res2"), "--result-filename", "all.json")
        assert code2 == 0, err2
    stack.close()
    yield d, out
    mp.undo()


class _Capture:
    """capsys's readouterr for a module-scoped fixture (capsys is per test)."""

    def __init__(self):
        self.out, self.err = io.StringIO(), io.StringIO()

    def readouterr(self):
        o, e = self.out.getvalue(), self.err.getvalue()
        for b in (self.out, self.err):
            b.seek(0)
            b.truncate()
        return o, e


def _files(d):
    files = {int(NAME.fullmatch(f.name).group(1)): f for f in (d / "res").iterdir()}
    assert sorted(files) == [1, 3], [f.name for f in (d / "res").iterdir()]
    return {c: json.loads(f.read_text()) for c, f in files.items()}


def test_key_set_names_and_numbers_equal_our_document(bench_run):
    d, out = bench_run
    ours = {p["concurrency"]: p for p in json.loads((d / "ours.json").read_text())["load_points"]}
    for c, v in _files(d).items():
        want = VLLM_KEYS | VLLM_SPEC_KEYS | VLLM_DETAIL_KEYS | {"tp", "version"} | vllm_stat_keys(
            ("ttft", "tpot", "itl", "e2el"), ("p50", "p90", "p99"))
        assert set(v) == want
        s = ours[c]
        assert (v["tp"], v["version"], v["max_concurrency"], v["request_rate"]) == ("1", "x", c, "inf")
        assert v["model_id"] == s["model"] == "scripted-model" and v["backend"] == "openai"
        assert s["accept_length_source"] == "metrics:vllm" and s["accept_rate"] is not None
        assert v["spec_decode_acceptance_length"] == s["accept_length"]
        assert v["spec_decode_acceptance_rate"] == pytest.approx(s["accept_rate"] * 100)
        # the window's counts, consistent with vLLM's own derivations of rate and length
        n, acc = v["spec_decode_num_drafts"], v["spec_decode_accepted_tokens"]
        assert isinstance(n, int) and n > 0 and isinstance(acc, int)
        assert 1 + acc / n == pytest.approx(v["spec_decode_acceptance_length"])
        assert 100 * acc / v["spec_decode_draft_tokens"] == pytest.approx(
            v["spec_decode_acceptance_rate"])
        for theirs, mine in (("duration", "duration_s"), ("completed", "completed"),
                             ("failed", "failed"), ("total_input_tokens", "total_input_tokens"),
                             ("total_output_tokens", "total_output_tokens"),
                             ("request_throughput", "request_throughput_req_s"),
                             ("request_goodput", "goodput_req_s"),
                             ("output_throughput", "output_throughput_tok_s"),
                             ("total_token_throughput", "total_throughput_tok_s")):
            assert v[theirs] == s[mine], theirs
        for m, key in (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("itl", "chunk_gap_ms"),
                       ("e2el", "e2e_ms")):
            for stat in ("mean", "median", "std", "p90", "p99"):
                assert v[f"{stat}_{m}_ms"] == s[key][stat], (m, stat)
            assert v[f"p50_{m}_ms"] == pytest.approx(s[key]["median"])
        assert len(v["ttfts"]) == 9 and v["completed"] + v["failed"] == 9


def test_statistics_are_what_vllm_computes_from_the_lists(bench_run):
    """vLLM's calculate_metrics over the file's own per-request lists (seconds) gives the
    file's statistics (ms); failed requests carry vLLM's values; the peaks are recomputed."""
    d, _ = bench_run
    failed_seen = 0
    for c, v in _files(d).items():
        ok = [i for i, e in enumerate(v["errors"]) if not e]
        bad = [i for i in range(9) if i not in ok]
        failed_seen += len(bad)
        assert len(bad) == v["failed"]
        for i in bad:
            assert (v["ttfts"][i], v["itls"][i], v["latencies"][i], v["output_lens"][i],
                    v["generated_texts"][i]) == (0.0, [], 0.0, 0, "")
            assert v["errors"][i] == "http_500"
        ttfts = np.array([v["ttfts"][i] for i in ok])
        lat = np.array([v["latencies"][i] for i in ok])
        outs = np.array([v["output_lens"][i] for i in ok])
        tpots = (lat - ttfts) / (outs - 1)
        itls = np.array([g for i in ok for g in v["itls"][i]])
        for name, vals in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", lat)):
            assert v[f"mean_{name}_ms"] == pytest.approx(np.mean(vals) * 1e3, rel=1e-9)
            assert v[f"median_{name}_ms"] == pytest.approx(np.median(vals) * 1e3, rel=1e-9)
            assert v[f"p99_{name}_ms"] == pytest.approx(np.percentile(vals, 99) * 1e3, rel=1e-9)
        assert v["total_output_tokens"] == sum(v["output_lens"]) == 5 * len(ok)
        assert v["output_throughput"] == pytest.approx(sum(v["output_lens"]) / v["duration"])
        # peak concurrency: a sweep over [start, start + latency) of the completed requests
        ev = sorted([(v["start_times"][i], 1) for i in ok]
                    + [(v["start_times"][i] + v["latencies"][i], -1) for i in ok])
        assert v["max_concurrent_requests"] == max(np.cumsum([e for _, e in ev]))
        assert 1 <= v["max_concurrent_requests"] <= c
        assert v["max_output_tokens_per_s"] <= v["total_output_tokens"]
        # closed loop = vLLM's rate inf with a concurrency: queued from the start until sent
        assert v["queue_times"][0] == 0.0 and v["queue_times"] == sorted(v["queue_times"])
    assert failed_seen > 0  # the failure conventions were exercised


def test_our_vllm_importer_reads_it_back(bench_run, monkeypatch, capsys, tmp_path):
    d, _ = bench_run
    ours = {p["concurrency"]: p for p in json.loads((d / "ours.json").read_text())["load_points"]}
    f = next(p for p in (d / "res").iterdir() if "concurrency3" in p.name)
    code, _, err = cli(monkeypatch, capsys, "import", "vllm", str(f), "--store",
                       str(tmp_path / "s.db"))
    assert code == 0, err
    with Store(tmp_path / "s.db") as st:
        (row,) = st.load_points(source="import:vllm")
        recs = list(st.requests(row))
    s, o = row.summary, ours[3]
    assert row.load_key == "c=3" and s["completed"] == o["completed"] and s["failed"] == o["failed"]
    for key in ("ttft_ms", "tpot_ms", "chunk_gap_ms", "e2e_ms"):
        for stat in ("mean", "median", "p90", "p99", "std"):
            assert s[key][stat] == pytest.approx(o[key][stat], rel=1e-12), (key, stat)
    for key in ("output_throughput_tok_s", "request_throughput_req_s", "total_throughput_tok_s",
                "goodput_req_s"):
        assert s[key] == pytest.approx(o[key], rel=1e-12), key
    assert s["peak_concurrency"] >= 1 and len(recs) == 9
    assert s["accept_length"] == o["accept_length"] and s["accept_rate"] == pytest.approx(
        o["accept_rate"])
    assert sorted(r["ttft_ms"] for r in recs if r["ok"]) == pytest.approx(
        sorted(np.array([t for t in json.loads(f.read_text())["ttfts"] if t]) * 1e3))


def test_append_result_is_one_line_per_point_with_vllm_default_keys(bench_run, monkeypatch,
                                                                     capsys, tmp_path):
    d, _ = bench_run
    lines = (d / "res2" / "all.json").read_text().splitlines()
    docs = [json.loads(x) for x in lines]
    assert [v["max_concurrency"] for v in docs] == [1, 3]
    for v in docs:  # no --save-detailed: vLLM's default metrics ttft,tpot,itl at p99
        assert set(v) == VLLM_KEYS | VLLM_SPEC_KEYS | vllm_stat_keys(("ttft", "tpot", "itl"),
                                                                     ("p99",))
        assert v["request_goodput"] is None and v["label"] is None
    code, _, err = cli(monkeypatch, capsys, "import", "vllm", str(d / "res2" / "all.json"),
                       "--store", str(tmp_path / "s.db"))
    assert code == 0, err
    with Store(tmp_path / "s.db") as st:
        assert sorted(r.load_key for r in st.load_points()) == ["c=1", "c=3"]


def test_a_statistic_of_no_values_is_null_not_zero():
    """vLLM writes np.mean(0) = 0 for a metric without values; we write null."""
    rec = {"ok": True, "t_start_ns": 1_000_000_000, "start_s": 0.0, "ttft_ms": 4.0,
           "e2e_ms": 4.0, "tpot_ms": None, "chunk_gap_ms": [], "chunk_tokens": [1],
           "input_tokens": 3, "output_tokens": 1, "error": None, "dispatch_lag_ms": None}
    summary = {"concurrency": 1, "request_rate": None, "model": "m", "ttft_ms": {"mean": 4.0},
               "tpot_ms": dict.fromkeys(("mean", "median", "p90", "p95", "p99", "std"))}
    cfg = vllm_layout.VllmResultConfig(percentiles=(50.0, 99.9))
    v = vllm_layout.result_document(summary, [rec], cfg=cfg, api="chat", tokenizer=None,
                                    label=None, burstiness=1.0, date="20260101-000000")
    assert v["mean_tpot_ms"] is None and v["p99.9_tpot_ms"] is None and v["p50_itl_ms"] is None
    assert v["p50_ttft_ms"] == 4.0 and v["backend"] == "openai-chat"
    assert (v["max_concurrent_requests"], v["max_output_tokens_per_s"]) == (1, 1.0)
    assert vllm_layout.file_path(cfg, v).name == "openai-chat-infqps-concurrency1-m-20260101-000000.json"


@pytest.mark.parametrize("args, needle", [
    (["--save-result", "--result-dir", "/proc/no/such/dir"], "--result-dir /proc/no/such/dir"),
    (["--save-detailed"], "--save-result"),
    (["--metadata", "tp=1"], "--save-result"),
    (["--save-result", "--metadata", "duration=1"], "key of the result"),
    (["--save-result", "--metadata", "tp"], "KEY=VALUE"),
    (["--save-result", "--metric-percentiles", "0,99"], "--metric-percentiles"),
    (["--save-result", "--percentile-metrics", "ttft,latency"], "--percentile-metrics"),
])
def test_bad_result_flags_give_one_line_before_any_load(monkeypatch, capsys, args, needle):
    code, _, err = cli(monkeypatch, capsys, "bench", "--base-url", "http://127.0.0.1:9",
                       "--concurrency", "1", *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err


def test_file_names_of_several_points():
    """One file per load point: vLLM's default name holds the load; a --result-filename gets
    the load added to its stem, unless --append-result gathers the points in it."""
    doc = {"request_rate": 4.0, "max_concurrency": None, "model_id": "org/M", "label": None,
           "backend": "openai", "date": "20260101-000000"}
    one = vllm_layout.VllmResultConfig(result_dir="d", result_filename="sub/r.json")
    many = vllm_layout.VllmResultConfig(result_filename="r.json", several_points=True)
    both = vllm_layout.VllmResultConfig(result_filename="r.json", several_points=True,
                                        append=True)
    assert str(vllm_layout.file_path(one, doc)) == "d/sub/r.json"
    assert str(vllm_layout.file_path(many, doc)) == "r-4.0qps.json"
    assert str(vllm_layout.file_path(both, doc)) == "r.json"
    assert str(vllm_layout.file_path(vllm_layout.VllmResultConfig(), doc)) == \
        "openai-4.0qps-M-20260101-000000.json"
