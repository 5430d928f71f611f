"""Strings from outside are printed literally: Rich markup in a label, model id, error message
or kernel name is shown as typed (it used to raise MarkupError or hide `[tile]`), and terminal
escape sequences arrive escaped (`\\x1b`), never raw. Real subprocesses of the CLI, a real store,
a real trace file."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from servelab.console import literal, make_console
from servelab.profile.synth import SynthKernel, write_trace
from servelab.store import Store

HOSTILE_MODEL = "\x1b]0;pwned\x07\x1b[2J[bold]m"
HOSTILE_LABEL = "[/x] [red]lab\u202eel"
HOSTILE_ERROR = "[/]boom\x1b[31m red"


def servelab(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400"}  # wide: cells on one line, so the asserts see them
    return subprocess.run([sys.executable, "-m", "servelab", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def _clean(out: str) -> None:
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out, repr(out[:400])


@pytest.fixture
def store(tmp_path):
    db = tmp_path / "r.db"
    summary = {"load_key": "c=1", "completed": 3, "failed": 1, "output_throughput_tok_s": 10.0,
               "ttft_ms": {"median": 5.0}, "failure_reasons": {HOSTILE_ERROR: 1},
               "api": "completions", "protocol": "openai-completions"}
    with Store(db) as st:
        a = st.add_load_point(summary=summary, provenance={"host": "[/h]"}, load_key="c=1",
                              label=HOSTILE_LABEL, model=HOSTILE_MODEL)
        b = st.add_load_point(summary={**summary, "output_throughput_tok_s": 12.1},
                              provenance={}, load_key="c=1", label="[tile]", model="m")
    return db, a, b


def test_results_list_and_show_print_stored_strings_literally(store):
    db, a, _ = store
    for args in (["results", "list"], ["results", "show", str(a)]):
        r = servelab(*args, "--store", str(db))
        assert r.returncode == 0, r.stderr
        _clean(r.stdout)
        assert "\\x1b]0;pwned\\x07" in r.stdout  # visible, escaped
    r = servelab("results", "list", "--store", str(db))
    assert "[/x] [red]lab\\u202eel" in r.stdout and "[tile]" in r.stdout
    r = servelab("results", "show", str(a), "--store", str(db))
    assert "[/]boom\\x1b[31m red: 1" in r.stdout


def test_results_show_json_is_valid_and_terminal_safe(store):
    import json

    db, a, _ = store
    r = servelab("results", "show", str(a), "--json", "--store", str(db))
    assert r.returncode == 0, r.stderr
    _clean(r.stdout)
    doc = json.loads(r.stdout)
    assert doc["model"] == HOSTILE_MODEL and doc["label"] == HOSTILE_LABEL  # same values


def test_compare_prints_labels_literally(store):
    db, a, b = store
    r = servelab("compare", str(a), str(b), "--store", str(db))
    assert r.returncode == 0, r.stderr
    _clean(r.stdout + r.stderr)
    assert "[/x] [red]lab" in r.stdout and "[tile]" in r.stdout


def test_profile_keeps_brackets_in_kernel_names(tmp_path):
    trace = tmp_path / "t.json"
    k = [SynthKernel("cutlass_gemm[tile]_kernel", 50.0),
         SynthKernel("evil\x1b[2J[/]kernel", 30.0)]
    write_trace(trace, [k, k, k])
    r = servelab("profile", str(trace), "--top", "5")
    assert r.returncode == 0, r.stderr
    _clean(r.stdout)
    assert "cutlass_gemm[tile]_kernel" in r.stdout and "evil\\x1b[2J[/]kernel" in r.stdout


def test_error_lines_are_literal_and_one_line():
    """A user-given value echoed in an error (a path with an escape and a newline) stays one
    literal line."""
    r = servelab("results", "show", "1", "--store", "/nonexistent\x1b[2J\ndir/\x07r.db/")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    _clean(r.stderr)


def test_console_escapes_but_keeps_own_layout(capsys):
    """The console: markup off, controls escaped before layout (so tables stay aligned),
    newlines of our own multi-line messages kept."""
    assert literal("a\x1b[2Jb\nc") == "a\\x1b[2Jb\\x0ac"
    assert literal("a\nb", keep_newlines=True) == "a\nb"
    con = make_console(width=80)
    con.print("[bold]x[/bold]\x9b\nnext line")
    out = capsys.readouterr().out
    assert out == "[bold]x[/bold]\\x9b\nnext line\n"
