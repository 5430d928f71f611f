"""The CLI shell: every input error is one line on stderr with exit status 2, never a usage box
or a traceback (real subprocesses of the installed entry point)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def servelab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servelab", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args,needle", [
    (["bench", "--bogus"], "No such option: --bogus"),
    (["nosuchverb"], "No such command 'nosuchverb'"),
    (["run"], "Missing argument"),
    (["results", "show", "424242"], "no load point with id 424242"),
])
def test_input_errors_are_one_line(args, needle):
    r = servelab(*args)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_help_and_version_exit_zero():
    assert servelab("--version").stdout.strip().startswith("servelab ")
    r = servelab("bench", "--help")
    assert r.returncode == 0 and "--base-url" in r.stdout
