"""The results store against a real SQLite file."""

from __future__ import annotations

import sqlite3

import pytest

from servelab.errors import UserError
from servelab.store import Store


def test_load_point_roundtrip_with_requests(tmp_path):
    db = tmp_path / "r.db"
    with Store(db) as st:
        recs = [{"ttft_ms": 1.5, "ok": True}, {"ttft_ms": None, "ok": False, "error": "timeout"}]
        lp_id = st.add_load_point(summary={"ttft_ms": {"median": 1.5}}, provenance={"host": "h"},
                                  load_key="c=8", concurrency=8, requests=recs)
        row = st.load_point(lp_id)
        assert row.summary == {"ttft_ms": {"median": 1.5}}
        assert row.concurrency == 8 and row.load_key == "c=8"
        assert list(st.requests(row)) == recs
    # an independent reader sees the row and WAL mode
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("SELECT count(*) FROM load_points").fetchone()[0] == 1


def test_experiment_resume_and_conflicting_design(tmp_path):
    with Store(tmp_path / "r.db") as st:
        assert st.ensure_experiment("e", {"a": 1}, "h1") is False
        assert st.ensure_experiment("e", {"a": 1, "hypothesis": "new"}, "h1") is True
        assert st.experiment("e")["hypothesis"] == "new"  # a resume keeps the free text current
        with pytest.raises(UserError, match="different design"):
            st.ensure_experiment("e", {"a": 2}, "h2")
        st.add_run(experiment="e", arm="A", load_key="c=1", repetition=0, status="failed", error="x")
        st.add_run(experiment="e", arm="A", load_key="c=1", repetition=0, status="ok", load_point_id=None)
        runs = st.runs("e")
        assert [(r.arm, r.status) for r in runs] == [("A", "ok")]


def test_unknown_ids_and_names_explain_themselves(tmp_path):
    with Store(tmp_path / "r.db") as st:
        with pytest.raises(UserError, match="results list"):
            st.load_point(42)
        with pytest.raises(UserError, match="known: none"):
            st.experiment("nope")


def test_corrupt_store_is_a_user_error(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(UserError, match="not usable"):
        Store(bad)
