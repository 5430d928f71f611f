"""`results list|show --store FILE` read a store: a FILE that does not exist is a one-line error
naming it. Before, the readers created an empty database there (and its folders) and answered
"no load points stored yet", so a typo in --store looked like an empty store and left a file."""

from __future__ import annotations

import pytest
from cli_inproc import cli


@pytest.mark.parametrize("verb", [("results", "list"), ("results", "show", "1"),
                                  ("results", "list", "--json")])
def test_reading_a_store_that_does_not_exist_is_refused(monkeypatch, capsys, tmp_path, verb):
    typo = tmp_path / "sub" / "reslts.db"
    code, out, err = cli(monkeypatch, capsys, *verb, "--store", str(typo))
    assert code == 2 and not out, (out, err)
    assert err.strip().splitlines() == [
        f"error: --store {typo}: no results store there; `servelab bench` or `servelab import` "
        "creates one (leave --store out for the default)"]
    assert not typo.exists() and not typo.parent.exists()
