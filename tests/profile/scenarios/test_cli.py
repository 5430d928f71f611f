"""The documented command lines, end to end, and `profile capture` against a fake server."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app

FIX = Path(__file__).parents[1] / "fixtures"
runner = CliRunner()


def test_profile_trace_json_html_whatif_vs(tmp_path):
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    res = runner.invoke(app, [
        "profile", str(FIX / "eager_big.json.gz"), "--what-if", "attention=free",
        "--what-if", "gemm=2x", "--vs", str(FIX / "graph_big.json.gz"),
        "--output-file", str(out), "--html", str(page),
    ])
    assert res.exit_code == 0, res.output
    first = res.output.lstrip().splitlines()[0]  # idle is reported before any kernel
    assert first.startswith("TPOT is set by DECODE") and "HOST-BOUND" in first
    doc = json.loads(out.read_text())
    for key in ("steps", "gpu_busy_fraction", "categories", "top_kernels", "what_if", "vs",
                "ranking", "provenance"):
        assert key in doc
    assert all("gpu_busy_fraction" in s for s in doc["steps"])
    assert doc["what_if"]["specs"] == ["attention=free", "gemm=2x"]
    assert doc["vs"]["step_ratio"] < 0.6  # CUDA graphs: 1334 -> 614 us per step
    html = page.read_text()
    assert html.startswith("<!doctype html>") and "<svg" in html and "HOST-BOUND" in html
    assert "<script" not in html


def test_many_steps_are_summarised(tmp_path):
    from servelab.profile.synth import SynthKernel, write_trace

    p = tmp_path / "many.json"
    write_trace(p, [[SynthKernel("nvjet_gemm", 10.0)] for _ in range(40)], step_wall_us=40.0,
                gpu_offset_us=0.0)
    res = runner.invoke(app, ["profile", str(p)])
    assert res.exit_code == 0, res.output
    assert "HOST-BOUND: the GPU is idle 75%" in res.output
    assert "step wall us: median 40.0 (min 40.0, max 40.0); idle: median 75.0%" in res.output


def test_step_regex_and_user_rules(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\ncategory = "my_gemms"\npatterns = ["nvjet"]\n')
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["profile", str(FIX / "eager_big.json.gz"), "--rules", str(rules),
                              "--step-regex", r"^ProfilerStep#\d+$", "--output-file", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    cats = {c["category"] for c in doc["categories"]}
    assert "my_gemms" in cats and "gemm" in cats  # splitKreduce still falls to the built-in gemm
    assert doc["steps"][0]["name"] == "ProfilerStep#2"


def test_bad_inputs_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2},')
    short_gz = tmp_path / "short.json.gz"  # cut inside the first gzip block: fails on the first read
    short_gz.write_bytes((FIX / "eager_small.json.gz").read_bytes()[:100])
    cases = [
        (["profile", str(bad)], "truncated"),
        (["profile", str(short_gz)], "truncated at event #0"),
        (["profile", str(FIX / "eager_small.json.gz"), "--step-regex", "("], "--step-regex"),
        (["profile", str(FIX / "cpu_only.json.gz")], "no GPU events"),
        (["profile", str(FIX / "eager_small.json.gz"), "--what-if", "warp=free"], "neither a category"),
        (["ceiling", "--model", "gpt-9", "--gpu", "h200"], "known: deepseek-v3"),
        (["ceiling", "--model", "llama-3.1-8b", "--gpu", "a100"], "known: b200, h100, h200"),
        (["ceiling", "--model", "llama-3.1-8b", "--gpu", "h200", "--batch", "1,x"], "--batch"),
    ]
    for argv, needle in cases:
        proc = subprocess.run([sys.executable, "-m", "servelab", *argv], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2, (argv, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


def test_ceiling_json_has_tok_s(tmp_path):
    out = tmp_path / "c.json"
    res = runner.invoke(app, ["ceiling", "--model", "deepseek-v4-flash", "--gpu", "rtx-pro-6000",
                              "--tp", "8", "--batch", "1,8,16", "--context", "512", "--kv-dtype",
                              "fp8", "--mtp-accept", "1.7", "--mtp-draft", "1", "--measured", "25",
                              "--output-file", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert set(doc["tok_s"]) == {"1", "8", "16"}
    assert all(r["efficiency"] == pytest.approx(25 / r["tok_s"]) for r in doc["bounds"])
    assert all("mtp_speedup" in r for r in doc["bounds"])
    assert doc["sources"]["model"]["source"] and doc["sources"]["gpu"]["source"]


class _FakeSGLang(BaseHTTPRequestHandler):
    """/start_profile then, after a few completions, writes a real trace into output_dir."""

    state: dict = {}

    def log_message(self, *a):  # quiet
        pass

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        st = self.state
        if self.path == "/start_profile":
            st["req"] = body
            reply = b'"Start profiling."'
        elif self.path == "/v1/completions":
            if "req" in st:  # completions after the profile started
                st["completions"] = st.get("completions", 0) + 1
            if st.get("completions") == 3:
                out = Path(st["req"]["output_dir"])
                shutil.copy(FIX / "graph_small.json.gz", out / "1764-TP-0.trace.json.gz")
            reply = json.dumps({"choices": [{"text": "x"}]}).encode()
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


def test_profile_capture_against_a_fake_server(tmp_path):
    _FakeSGLang.state = {}
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FakeSGLang)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        out = tmp_path / "traces"
        res = runner.invoke(app, ["profile", "capture", "--url", url, "--num-steps", "40",
                                  "--out", str(out), "--load", "2", "--timeout", "20",
                                  "--output-file", str(tmp_path / "cap.json")])
        assert res.exit_code == 0, res.output
        req = _FakeSGLang.state["req"]
        assert req["num_steps"] == 40 and req["activities"] == ["CPU", "GPU"]
        assert Path(req["output_dir"]) == out.resolve()
        assert "1764-TP-0.trace.json.gz" in res.output
        doc = json.loads((tmp_path / "cap.json").read_text())
        assert doc["cuda_graphs"]["graph_launches"] == 5
        # the fake has no /metrics: the capture waited --settle and says so; graph_small's
        # ProfilerStep#N steps have no engine phase
        assert doc["capture"]["window"] == {"STEP": {"n_steps": 5, "batch_sizes": {}}}
        assert "has no /metrics to watch" in doc["capture"]["started"]
    finally:
        srv.shutdown()


def test_capture_reports_unreachable_server(tmp_path, free_port):
    res = runner.invoke(app, ["profile", "capture", "--url", f"http://127.0.0.1:{free_port}",
                              "--out", str(tmp_path), "--timeout", "2"])
    assert res.exit_code != 0
    assert "cannot reach" in str(res.exception)


def _makeup(trace: Path) -> list[str]:
    """The step names of a trace, read with the stdlib (not servelab's reader)."""
    import gzip

    with gzip.open(trace, "rt") as f:
        ev = json.load(f)["traceEvents"]
    return [e["name"] for e in sorted(ev, key=lambda e: e.get("ts", 0))
            if e.get("cat") == "user_annotation" and e.get("name", "").startswith("step[")]


def test_capture_from_the_embedded_engine_on_cpu(tmp_path, free_port):
    """The real `servelab serve` (tiny model, CPU), captured right after start-up: by default the
    window holds only steady-state decode steps at the load's batch (the capture waited for it),
    and says so; `--include-warmup` starts the profile before the load, so its window begins with
    the prefills that admit the load; `--phase extend` records prefills only. With no GPU the
    analysis says the trace has no GPU events."""
    pytest.importorskip("servelab.mini.server.app")
    import time
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "servelab", "serve", "--port", str(free_port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{free_port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=1).read()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                time.sleep(0.2)
        runs = {}
        for name, extra in (("steady", []), ("cold", ["--include-warmup"]),
                            ("extend", ["--phase", "extend"])):
            out = tmp_path / name
            cap = subprocess.run([sys.executable, "-m", "servelab", "profile", "capture", "--url",
                                  url, "--num-steps", "6", "--load", "3", "--max-tokens", "16",
                                  "--out", str(out), "--timeout", "60", *extra],
                                 capture_output=True, text=True, timeout=120)
            assert cap.returncode == 2 and "no GPU events" in cap.stderr, cap.stderr
            (trace,) = list(out.glob("*-TP-0.trace.json.gz"))
            runs[name] = (_makeup(trace), cap.stdout)
        steps, printed = runs["steady"]
        assert steps == ["step[DECODE bs=3]"] * 6, steps
        assert "window: 6 DECODE (bs 3 x6) (started after 8 decode steps at batch 3" in printed
        steps, printed = runs["cold"]
        assert len(steps) == 6 and steps[0].startswith("step[EXTEND"), steps
        assert "EXTEND (bs" in printed and "--include-warmup" in printed
        steps, printed = runs["extend"]  # one-token requests: every step is a prefill
        assert len(steps) == 6 and all(s.startswith("step[EXTEND") for s in steps), steps
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _bomb(path: Path, head: bytes, body: bytes, repeat: int, tail: bytes) -> None:
    import gzip

    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(head)
        for _ in range(repeat):  # never the whole inflated text in memory here
            f.write(body)
        f.write(tail)


@pytest.mark.parametrize("kind", ["one huge value", "many events"])
def test_a_decompression_bomb_is_refused_with_bounded_memory(tmp_path, kind):
    """A ~1 MB .json.gz that inflates to 1 GB took `profile` to 2 GB RSS (inflated whole); now
    the whole-file path reads at most 16 MB, the stream stops at 200x the file's size, and a
    value longer than 4 MiB (whose parse time grows with its square) is refused."""
    bomb = tmp_path / "bomb.json.gz"
    if kind == "one huge value":
        _bomb(bomb, b'{"traceEvents": [{"name": "', b"a" * (1 << 20), 64, b'"}]}')  # 64 MiB
    else:
        ev = b'{"ph": "X", "cat": "cpu_op", "name": "' + b"o" * 1000 + b'", "ts": 1},'
        _bomb(bomb, b'{"traceEvents": [', ev * 100, 1000, b'{"name": "end"}]}')  # 103 MB
    assert bomb.stat().st_size < 1 << 20  # inflates > 100x: bounded by the ratio
    code = (
        "from servelab.errors import UserError\n"
        "from servelab.profile.trace import read_trace\n"
        "try:\n"
        f"    read_trace({str(bomb)!r})\n"
        "except UserError as e:\n"
        "    print('refused:', e)\n"
        # VmHWM, not ru_maxrss: the latter keeps the parent's peak across fork + exec
        "hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0]\n"
        "print('maxrss_kb', hwm.split()[1])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    word = "not a Kineto trace" if kind == "one huge value" else "decompression bomb"
    assert "refused:" in r.stdout and word in r.stdout, r.stdout + r.stderr
    rss_mb = int(r.stdout.split("maxrss_kb")[1]) / 1024
    assert rss_mb < 300, f"peak RSS {rss_mb:.0f} MB"


class _StuckProfiler(BaseHTTPRequestHandler):
    """Starts a profile and never writes a trace; records /stop_profile."""

    calls: list = []

    def log_message(self, *a):  # quiet
        pass

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.calls.append(self.path)
        reply = b"{}" if self.path != "/v1/completions" else b'{"choices": [{"text": "x"}]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


def test_capture_that_times_out_or_is_interrupted_stops_the_profile(tmp_path):
    """The server was left profiling, and refused the next capture ('already running')."""
    import os
    import signal
    import time

    _StuckProfiler.calls = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _StuckProfiler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        res = runner.invoke(app, ["profile", "capture", "--url", url, "--out", str(tmp_path),
                                  "--timeout", "1", "--load", "0"])
        assert res.exit_code != 0 and "no trace file appeared" in str(res.exception)
        assert _StuckProfiler.calls == ["/start_profile", "/stop_profile"]
        _StuckProfiler.calls = []
        p = subprocess.Popen([sys.executable, "-m", "servelab", "profile", "capture", "--url",
                              url, "--out", str(tmp_path), "--timeout", "60", "--load", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 30
        while "/v1/completions" not in _StuckProfiler.calls and time.time() < deadline:
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        assert "/stop_profile" in _StuckProfiler.calls, (_StuckProfiler.calls, err)
        assert "Traceback" not in err
    finally:
        srv.shutdown()


def test_capture_settings_are_validated():
    from servelab.errors import UserError
    from servelab.profile.capture import CaptureConfig

    for kw, word in (({"load": -1}, "--load"), ({"num_steps": 0}, "--num-steps"),
                     ({"timeout_s": float("nan")}, "--timeout"), ({"url": "notaurl"}, "URL")):
        args = {"url": "http://127.0.0.1:1", "num_steps": 4, "out_dir": Path("."), **kw}
        with pytest.raises(UserError, match=word):
            CaptureConfig(**args)


def test_metric_mix_and_mix_from_a_stored_load_point(tmp_path, monkeypatch):
    """`--metric ttft` speaks of the prefill steps first; `--mix` and `--mix-from ID` add the
    workload-weighted bound (the load point's TTFT vs (tokens - 1) x TPOT)."""
    from servelab.store import Store

    monkeypatch.setenv("SERVELAB_HOME", str(tmp_path / "home"))
    with Store() as st:
        lp = st.add_load_point(summary={"ttft_ms": {"mean": 100.0}, "tpot_ms": {"mean": 10.0},
                                        "completed": 10, "total_output_tokens": 2000},
                               provenance={}, load_key="c=16", concurrency=16)
    trace = str(FIX / "engine_graph.json.gz")
    res = runner.invoke(app, ["profile", trace, "--metric", "ttft", "--mix",
                              "decode=0.9,extend=0.1", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["verdict"].startswith("TTFT is set by EXTEND") and doc["metric"] == "ttft"
    assert doc["mix_bound"]["phase_shares"] == pytest.approx({"DECODE": 0.9, "EXTEND": 0.1})
    res = runner.invoke(app, ["profile", trace, "--mix-from", str(lp), "--what-if", "gemm=free"])
    assert res.exit_code == 0, res.output
    assert f"workload-weighted bound (load point {lp} (c=16): EXTEND 5%, DECODE 95%)" in res.output
    other = tmp_path / "other.db"
    with Store(other) as st:
        lp2 = st.add_load_point(summary={"ttft_ms": {"mean": 50.0}, "tpot_ms": {"mean": 10.0},
                                         "completed": 1, "total_output_tokens": 6},
                                provenance={}, load_key="c=1", concurrency=1)
    res = runner.invoke(app, ["profile", trace, "--mix-from", str(lp2), "--store", str(other)])
    assert res.exit_code == 0 and "EXTEND 50%, DECODE 50%" in res.output, res.output
    for bad, word in ((["--metric", "itl"], "--metric"), (["--mix", "decode"], "--mix"),
                      (["--mix-from", "1", "--store", str(tmp_path / "none.db")], "no results"),
                      (["--mix", "decode=1", "--mix-from", "1"], "not both")):
        res = runner.invoke(app, ["profile", trace, *bad])
        assert res.exit_code != 0 and word in str(res.exception), (bad, res.output)
