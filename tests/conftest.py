"""Shared test set-up: every test gets its own SERVELAB_HOME, so nothing touches ~/.servelab."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture(autouse=True)
def _servelab_home(tmp_path, monkeypatch):
    home = tmp_path / "servelab-home"
    monkeypatch.setenv("SERVELAB_HOME", str(home))
    return home


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
