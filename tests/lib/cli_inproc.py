"""Run the `servelab` CLI in this process, as a user would from a shell, and capture what it
printed: (exit code, stdout, stderr). In-process so the tests can use pytest's capture and a
loopback server started in a thread."""

from __future__ import annotations

import sys


def cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    from servelab.cli import main

    monkeypatch.setattr(sys, "argv", ["servelab", *args])
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code or 0
    out, err = capsys.readouterr()
    return code, out, err
