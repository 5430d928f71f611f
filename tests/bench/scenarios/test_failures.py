"""Bad input: unreachable URL, HTTP errors, malformed SSE, cut streams, missing [DONE], timeouts.
Each request is recorded as failed with its reason, the run completes; invalid CLI values give one
line `error: ...` and exit status 2. Reference: the scripted server's own log of which failure it
injected into which request."""

from __future__ import annotations

import sys

import pytest

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.run import run_load_point
from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script

EXPECTED = {"http500": "http_500", "http429": "http_429", "http404": "http_404",
            "malformed": "malformed_sse", "cut": "connection_lost", "no_done": "no_end_marker",
            "stall": "timeout", "error_event": "server_error"}


def cfg_for(url: str, n: int, **kw) -> BenchConfig:
    return BenchConfig(base_url=url, workload=WorkloadConfig(input_len=8, output_len=9, num_prompts=n),
                       **kw)


def test_each_failure_mode_is_recorded_with_its_reason():
    modes = ("http500", "http429", "http404", "malformed", "cut", "no_done", "error_event")
    with serve_in_thread(Script(ttft_ms=2, gap_ms=1, fail_rate=1.0, fail_modes=modes)) as h:
        res = run_load_point(cfg_for(h.url, 14), LoadPoint(concurrency=3), progress=False)
        log = {r["id"]: r for r in h.log()}
    s = res.summary
    assert s["completed"] == 0 and s["failed"] == 14
    want: dict[str, int] = {}
    for r in log.values():
        want[EXPECTED[r["fail"]]] = want.get(EXPECTED[r["fail"]], 0) + 1
    assert s["failure_reasons"] == want
    assert all(s[m]["mean"] is None for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"))
    assert s["output_throughput_tok_s"] is None and s["accept_length"] is None
    for rec in res.records:
        assert not rec["ok"] and rec["ttft_ms"] is None and rec["error_detail"]


def test_mixed_failures_leave_the_successes_measured():
    with serve_in_thread(Script(ttft_ms=2, gap_ms=1, fail_rate=0.4, seed=3,
                                fail_modes=("http503", "cut", "malformed"))) as h:
        res = run_load_point(cfg_for(h.url, 30), LoadPoint(concurrency=4), progress=False)
        log = h.log()
    injected = sum(1 for r in log if r["fail"])
    assert 0 < injected < 30
    s = res.summary
    assert s["failed"] == injected and s["completed"] == 30 - injected
    assert s["ttft_ms"]["mean"] is not None and s["ttft_ms"]["mean"] >= 2.0
    ok = [r for r in res.records if r["ok"]]
    assert all(r["output_tokens"] == 9 for r in ok)
    assert s["total_output_tokens"] == 9 * len(ok)


def test_stall_becomes_timeout_and_run_finishes():
    with serve_in_thread(Script(ttft_ms=1, gap_ms=1, fail_rate=1.0, fail_modes=("stall",),
                                stall_s=30)) as h:
        res = run_load_point(cfg_for(h.url, 2, request_timeout_s=0.5), LoadPoint(concurrency=2),
                             progress=False)
    assert res.summary["failure_reasons"] == {"timeout": 2}
    assert all(r["e2e_ms"] is None for r in res.records)


def test_unreachable_url_counts_connect_errors(free_port):
    res = run_load_point(cfg_for(f"http://127.0.0.1:{free_port}", 3), LoadPoint(concurrency=2),
                         progress=False)
    assert res.summary["failure_reasons"] == {"connect_error": 3}
    assert res.summary["completed"] == 0 and res.summary["input_len_exact"] is False


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    from servelab.cli import main

    monkeypatch.setattr(sys, "argv", ["servelab", *args])
    with pytest.raises(SystemExit) as ei:
        main()
    out, err = capsys.readouterr()
    return ei.value.code, out, err


@pytest.mark.parametrize("args,needle", [
    (["--concurrency", "1,x"], "--concurrency"),
    (["--concurrency", "0"], "--concurrency"),
    (["--concurrency", "2", "--request-rate", "3"], "not supported"),
    (["--max-concurrency", "2", "--request-rate", "inf,3"], "not supported"),
    (["--request-rate", "-1"], "--request-rate"),
    (["--request-rate", "nan"], "--request-rate"),
    (["--num-prompts", "5"], "--sweep"),
    (["--sweep", "--concurrency", "1"], "--sweep chooses"),
    (["--concurrency", "1", "--slo", "ttft_p99_ms=2000"], "add --sweep"),
    (["--sweep", "--slo", "latency_p99_ms=5"], "--slo key"),
    (["--sweep", "--slo", "ttft_p97_ms=5"], "--slo key"),
    (["--sweep", "--slo", "itl_ms=5"], "per-request"),
    (["--sweep", "--slo", "ttft_p99_ms=-5"], "--slo"),
    (["--sweep", "--slo", "ttft:500,attainment=1.5"], "attainment"),
    (["--sweep", "--slo", "ttft_p99_ms=5,ttft_p99=6"], "more than once"),
    (["--sweep", "--slo", "ttft:500", "--goodput", "ttft:400"], "differ"),
    (["--sweep", "--sweep-precision", "0"], "--sweep-precision"),
    (["--sweep", "--sweep-rates", "5", "--sweep-max-points", "4"], "--sweep-max-points"),
    (["--concurrency", "1", "--save-result", "--result-dir", "/proc/no/such"], "--result-dir"),
    (["--concurrency", "1", "--result-filename", "x.json"], "--save-result"),
    (["--concurrency", "1", "--num-prompts", "ten"], "--num-prompts"),
    (["--concurrency", "1", "--goodput", "latency_ms=5"], "--goodput"),
    (["--concurrency", "1", "--goodput", "ttft_ms=fast"], "--goodput"),
    (["--concurrency", "1", "--api", "grpc"], "--api"),
    (["--concurrency", "1", "--dataset", "/nonexistent.json"], "--dataset"),
    (["--concurrency", "1", "--max-duration", "0"], "--max-duration"),
    (["--concurrency", "1", "--input-len", "0"], "--input-len"),
    (["--concurrency", "1", "--max-duration", "inf"], "--max-duration"),
    (["--concurrency", "1", "--request-timeout", "inf"], "--request-timeout"),
    (["--request-rate", "2", "--seed", "-1"], "--seed"),
    (["--concurrency", "1", "--output", "/"], "--output"),
    (["--concurrency", "1", "--output", "/proc/no/such/dir/o.json"], "--output"),
])
def test_invalid_cli_values_give_one_line(monkeypatch, capsys, args, needle):
    code, out, err = run_cli(monkeypatch, capsys, "bench", "--base-url", "http://127.0.0.1:9", *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err


def test_bad_base_url_is_one_line(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "bench", "--base-url", "localhost:8000",
                           "--concurrency", "1")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--base-url" in err


def test_cli_unreachable_completes_and_reports(monkeypatch, capsys, free_port, tmp_path):
    out_file = tmp_path / "o.json"
    code, out, err = run_cli(monkeypatch, capsys, "bench", "--base-url",
                             f"http://127.0.0.1:{free_port}", "--concurrency", "2",
                             "--num-prompts", "2", "--quiet", "--output", str(out_file))
    assert code == 1  # nothing measured: visible to scripts
    assert "connect_error x2" in out
    assert "connect_error: " in out and "127.0.0.1" in out  # an example of the reason's detail
    import orjson

    doc = orjson.loads(out_file.read_bytes())
    assert doc["load_points"][0]["failure_reasons"] == {"connect_error": 2}


def test_api_key_from_the_environment(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("SERVELAB_API_KEY", raising=False)
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.5, api_key="s3cret")) as h:
        res = run_load_point(cfg_for(h.url, 2), LoadPoint(concurrency=2), progress=False)
        assert res.summary["failure_reasons"] == {"http_401": 2}
        monkeypatch.setenv("SERVELAB_API_KEY", "s3cret")
        res = run_load_point(cfg_for(h.url, 2), LoadPoint(concurrency=2), progress=False)
        assert res.summary["completed"] == 2


def test_payload_of_unexpected_shape_fails_that_request_only(free_port):
    """`choices` holding a string instead of an object: recorded, not raised."""
    import asyncio
    import threading

    from aiohttp import web

    async def handler(request):
        r = web.StreamResponse()
        await r.prepare(request)
        await r.write(b'data: {"choices": ["oops"]}\n\ndata: [DONE]\n\n')
        return r

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", free_port).start())
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    try:
        res = run_load_point(cfg_for(f"http://127.0.0.1:{free_port}", 2), LoadPoint(concurrency=1),
                             progress=False)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        th.join(10)
    assert res.summary["failure_reasons"] == {"malformed_sse": 2}


def test_cli_warns_when_the_server_does_not_honour_the_output_length(monkeypatch, capsys):
    """A server that stops at its natural length (here: the client's ignore_eos/min_tokens
    dropped on the way) gives shorter answers; the run says so instead of passing silently."""
    from servelab.bench.client import Client

    body = Client.body

    def no_fixed_length(self, spec):
        b = body(self, spec)
        b.pop("ignore_eos", None)
        b.pop("min_tokens", None)
        return b

    monkeypatch.setattr(Client, "body", no_fixed_length)
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.5, natural_len=3)) as h:
        code, out, err = run_cli(monkeypatch, capsys, "bench", "--base-url", h.url,
                                 "--concurrency", "2", "--num-prompts", "4", "--output-len", "8",
                                 "--quiet", "--no-store")
    assert code in (0, None), err
    assert "4 of 4 completed requests returned another output length" in " ".join(out.split())
