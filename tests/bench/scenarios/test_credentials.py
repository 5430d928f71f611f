"""Credentials given to `servelab bench` connect but are never stored or shown. Before: the
password of `--base-url http://alice:PW@host` landed in the stored load point, its summary,
`--json`, the `--output` file and the console line, and together with SERVELAB_API_KEY it raised
aiohttp's ValueError (two Authorization headers)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cli_inproc import cli

from servelab.bench.config import BenchConfig, WorkloadConfig
from servelab.bench.run import request_auth
from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script
from servelab.errors import UserError

PASSWORD = "pw-Zq81xVr7TtKk"
KEY = "sk-test-9Jx2LmQ4"


def _cfg(url: str) -> BenchConfig:
    return BenchConfig(base_url=url, workload=WorkloadConfig(input_len=4, output_len=3,
                                                            num_prompts=2, seed=1))


def test_the_url_credentials_travel_as_basic_auth_and_are_shown_redacted(monkeypatch):
    monkeypatch.delenv("SERVELAB_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    cfg = _cfg(f"http://alice:p%40{PASSWORD}@127.0.0.1:8000/v1")
    assert cfg.root_url == "http://127.0.0.1:8000"
    assert PASSWORD not in cfg.shown_url and "127.0.0.1:8000" in cfg.shown_url
    kind, _, token = request_auth(cfg)["Authorization"].partition(" ")
    assert kind == "Basic" and base64.b64decode(token).decode() == f"alice:p@{PASSWORD}"
    with pytest.raises(UserError) as err:
        _cfg(f"http://127.0.0.1:8000/?api_key={PASSWORD}")
    assert PASSWORD not in str(err.value) and "SERVELAB_API_KEY" in str(err.value)


def test_with_an_api_key_too_the_key_wins_and_a_warning_says_so(monkeypatch, capsys):
    monkeypatch.setenv("SERVELAB_API_KEY", KEY)
    headers = request_auth(_cfg(f"http://alice:{PASSWORD}@127.0.0.1:8001"))
    assert headers == {"Authorization": f"Bearer {KEY}"}
    err = capsys.readouterr().err
    assert "API key is sent" in err and PASSWORD not in err


def _files_text(root: Path) -> str:
    return "\n".join(p.read_bytes().decode("latin-1") for p in root.rglob("*") if p.is_file())


def test_a_bench_with_url_credentials_and_an_api_key_stores_and_prints_no_secret(
        monkeypatch, capsys, tmp_path, _servelab_home):
    monkeypatch.setenv("SERVELAB_API_KEY", KEY)
    out_file = tmp_path / "out.json"
    with serve_in_thread(Script(ttft_ms=1, gap_ms=1, api_key=KEY)) as h:
        url = h.url.replace("http://", f"http://alice:{PASSWORD}@")
        code, out, err = cli(monkeypatch, capsys, "bench", "--base-url", url, "--concurrency", "1",
                             "--num-prompts", "3", "--input-len", "4", "--output-len", "3",
                             "--output", str(out_file), "--json")
        assert code == 0, err
        assert len(h.log()) >= 3                  # the server accepted the bearer key
    doc = json.loads(out)
    assert doc["load_points"][0]["completed"] == 3
    for where, text in [("stdout", out), ("stderr", err), ("--output", out_file.read_text()),
                        ("SERVELAB_HOME", _files_text(_servelab_home))]:
        assert PASSWORD not in text, where
        assert KEY not in text, where
    assert "<redacted>@" in out_file.read_text()
