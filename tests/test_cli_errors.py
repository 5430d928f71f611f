"""The CLI's one error policy, through real subprocesses: every failure a user can cause is one
`error:` line (exit 2, or 1 when it is not the user's), `--debug` / SERVELAB_DEBUG=1 show the
traceback, bare `servelab` prints help without an empty error line; plus generated command
lines (hypothesis) that may exit 0, 1 or 2 but never show a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servelab.profile.synth import SynthKernel, write_trace


def servelab(*args: str, env: dict | None = None, timeout: float = 120
             ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servelab", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def _one_line(r: subprocess.CompletedProcess, code: int, needle: str) -> None:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == code, (r.returncode, r.stderr[-1500:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr + r.stdout


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    p = tmp_path_factory.mktemp("t") / "t.json"
    write_trace(p, [[SynthKernel("gemm", 10.0)]] * 3)
    return p


def test_bare_servelab_prints_help_without_an_error_line():
    r = servelab()
    assert "Usage" in r.stdout + r.stderr and "error:" not in r.stderr, r.stderr


def test_outputs_that_cannot_be_written(tmp_path, trace):
    """--output-file DIR, --output-file /proc/1/x: one line before the work (they used to
    traceback)."""
    _one_line(servelab("profile", str(trace), "--output-file", str(tmp_path)), 2, "is a folder")
    _one_line(servelab("profile", str(trace), "--output-file", "/proc/1/x"), 2, "/proc/1/x")
    _one_line(servelab("ceiling", "--model", "deepseek-v3", "--gpu", "h200", "--output-file",
                       str(tmp_path)), 2, "is a folder")


def test_profile_settings_are_validated(tmp_path, trace):
    _one_line(servelab("profile", str(trace), "--top", "-1"), 2, "--top")
    _one_line(servelab("profile", "capture", "--url", "notaurl"), 2, "not a server URL")
    _one_line(servelab("profile", "capture", "--url", "http://127.0.0.1:9", "--load", "-1"), 2,
              "--load")
    (tmp_path / "rules.toml").write_bytes(b"\xff\xfe\x00binary")
    _one_line(servelab("profile", str(trace), "--rules", str(tmp_path / "rules.toml")), 2,
              "not valid TOML")
    _one_line(servelab("profile", str(trace), "--rules", str(tmp_path)), 2, "cannot be read")


def test_tune_without_cuda_is_one_line(monkeypatch, capsys):
    """Without a CUDA device and without --device cpu a worker used to die with a traceback."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = _main(monkeypatch, capsys, "tune", "fp8-gemm", "--shape", "128,256",
                         "--batch-sizes", "1", "--out", "/nonexistent/never-written")
    assert code == 2 and err.count("\n") == 1 and "--device cpu" in err, err


@pytest.mark.parametrize("args,needle", [
    (["run", "{binary}", "--check"], "not UTF-8 text"),
    (["demo", "--file", "{binary}"], "not UTF-8 text"),
    (["tune", "fp8-gemm", "--device", "cpu", "--shape", "128,256", "--batch-sizes", "1",
      "--out", "{file}"], "{file}"),
])
def test_files_of_the_wrong_kind_are_one_line(tmp_path, monkeypatch, capsys, args, needle):
    """A binary experiment file, a file where a folder belongs: these used to traceback."""
    binary, file = tmp_path / "x.toml", tmp_path / "plain"
    binary.write_bytes(bytes(range(256)))
    file.write_text("x")
    monkeypatch.setenv("SERVELAB_HOME", str(tmp_path / "h"))
    args = [a.format(binary=binary, file=file) for a in args]
    code, _, err = _main(monkeypatch, capsys, *args)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    assert needle.format(file=file) in err


def test_debug_shows_the_traceback(tmp_path, trace):
    r = servelab("profile", str(trace), "--output-file", str(tmp_path), "--debug")
    assert r.returncode == 2 and "Traceback" in r.stderr and "error: " in r.stderr
    r = servelab("profile", str(trace), "--output-file", str(tmp_path),
                 env={"SERVELAB_DEBUG": "1"})
    assert r.returncode == 2 and "Traceback" in r.stderr


def test_unexpected_failures_are_one_line_with_exit_1(tmp_path):
    """A bug (here: a broken module forced in through PYTHONPATH would be too invasive, so a
    damaged store row is used: its JSON cannot be read) is one line, not a traceback."""
    import sqlite3

    from servelab.store import Store

    db = tmp_path / "r.db"
    with Store(db) as st:
        st.add_load_point(summary={}, provenance={}, load_key="c=1")
    con = sqlite3.connect(db)
    con.execute("UPDATE load_points SET summary = '{not json'")
    con.commit()
    con.close()
    _one_line(servelab("results", "list", "--store", str(db)), 2, "damaged")


# ---- generated command lines ------------------------------------------------------------------

VERBS = [["results", "list"], ["results", "show"], ["compare"], ["profile"], ["ceiling"],
         ["status"], ["import", "sglang"], ["import", "vllm"], ["profile", "capture"]]
FLAGS = ["--limit", "--top", "--json", "--noise-band", "--model", "--gpu", "--batch", "--tp",
         "--store", "--label", "--load", "--num-steps", "--url", "--timeout", "--context",
         "--what-if", "--mtp-accept", "--source", "--requests"]
VALUES = st.one_of(
    st.sampled_from(["-1", "0", "nan", "inf", "1e400", "99999999999999999999", "", " ",
                     "[/x]", "\x1b[2J", "/proc/1/x", "/", ".", "abc", "1,2,x", "h200",
                     "deepseek-v3", "http://127.0.0.1:9", "notaurl", "gemm=free", "-0.5"]),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
            max_size=8))


def _main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """The CLI's entry point in this process (its error policy is what is checked)."""
    from servelab.cli import main

    monkeypatch.setattr(sys, "argv", ["servelab", *args])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(verb=st.sampled_from(VERBS),
       rest=st.lists(st.one_of(st.sampled_from(FLAGS), VALUES), max_size=5))
def test_generated_command_lines_never_traceback(tmp_path, monkeypatch, capsys, verb, rest):
    monkeypatch.setenv("SERVELAB_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("COLUMNS", "200")
    store = ["--store", str(tmp_path / "gen.db")] if verb[0] in ("results", "import") else []
    code, out, err = _main(monkeypatch, capsys, *verb, *rest, *store)
    assert code in (0, 1, 2), (verb, rest, code, err[-800:])
    assert "Traceback" not in err + out and "internal error" not in err, (verb, rest, err[-1500:])
    if code:  # a one-line error, or the help of a group given no verb
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert (lines and lines[-1].startswith("error: ")) or "Usage" in out + err, (
            verb, rest, err[-800:])
