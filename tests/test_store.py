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
        for beyond in (10**23, -(10**23)):     # past SQLite's integers: not an overflow
            with pytest.raises(UserError, match="results list"):
                st.load_point(beyond)
        with pytest.raises(UserError, match="known: none"):
            st.experiment("nope")


def test_corrupt_store_is_a_user_error(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(UserError, match="not usable"):
        Store(bad)


def _damaged(tmp_path):
    """A store with rows, then 8 KB of garbage written into the middle of the file."""
    db = tmp_path / "d.db"
    with Store(db) as st:
        for i in range(60):
            st.add_load_point(summary={"pad": "x" * 2000, "i": i}, provenance={}, load_key="c=1")
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    size = db.stat().st_size
    with open(db, "r+b") as f:
        f.seek(size // 2)
        f.write(bytes(range(256)) * 32)
    return db


def test_damaged_store_is_refused_for_writing_with_a_recovery_hint(tmp_path):
    """It used to accept writes (bench printed 'stored as #14', exit 0) and traceback on list."""
    db = _damaged(tmp_path)
    with pytest.raises(UserError, match=r"integrity check.*refused for writing.*\.recover"):
        Store(db)
    with Store(db, readonly=True) as st:  # readers open it and get one-line errors
        assert st.damage
        try:
            st.load_points()
        except UserError as exc:
            assert "\n" not in str(exc)


def test_provenance_and_logs_are_redacted_at_rest(tmp_path):
    db = tmp_path / "r.db"
    prov = {"env": {"HF_TOKEN": "hf_secret1", "NCCL_PROTO": "LL"},
            "processes": [{"argv": ["sglang", "--api-key", "sk-secret2", "--port", "1"],
                           "env": {"OPENAI_API_KEY": "sk-secret3"}}],
            "server_info": {"api_key": "sk-secret4", "max_total_tokens": 8192,
                            "max_prefill_tokens": 16384, "num_reserved_decode_tokens": 512},
            "base_url": "http://user:pw-secret5@127.0.0.1:1"}
    with Store(db) as st:
        lp = st.add_load_point(summary={}, provenance=prov, load_key="c=1")
        st.ensure_experiment("e", {}, "h")
        st.add_run(experiment="e", arm="a", load_key="c=1", repetition=0, status="failed",
                   error="launch failed: HF_TOKEN=hf_secret6", log_tail="--api-key sk-secret7 x")
        row = st.load_point(lp)
    raw = db.read_bytes() + (db.with_name("r.db-wal").read_bytes()
                             if db.with_name("r.db-wal").exists() else b"")
    for i in range(1, 8):
        assert f"secret{i}".encode() not in raw, i
    assert row.provenance["env"] == {"HF_TOKEN": "<redacted>", "NCCL_PROTO": "LL"}
    info = row.provenance["server_info"]
    assert info["max_total_tokens"] == 8192  # counts are not secrets, however many words
    assert (info["max_prefill_tokens"], info["num_reserved_decode_tokens"]) == (16384, 512)
    assert row.provenance["processes"][0]["argv"][3:] == ["--port", "1"]


def test_transaction_is_all_or_nothing_files_included(tmp_path):
    db = tmp_path / "r.db"
    with Store(db) as st:
        with pytest.raises(RuntimeError), st.transaction():
            st.add_load_point(summary={}, provenance={}, load_key="c=1", requests=[{"a": 1}])
            raise RuntimeError("second row failed")
        assert st.load_points() == []
        assert not list(st.requests_dir.glob("*.jsonl.gz"))


def test_bench_refuses_a_damaged_store_before_measuring(tmp_path):
    """`bench` used to measure, print 'stored as #14' and exit 0 into a damaged store."""
    import subprocess
    import sys

    db = _damaged(tmp_path)
    r = subprocess.run([sys.executable, "-m", "servelab", "bench", "--base-url",
                        "http://127.0.0.1:9", "--concurrency", "1", "--store", str(db)],
                       capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "integrity check" in lines[0], r.stderr
    assert "stored as" not in r.stdout


def test_an_experiments_spec_is_stored_with_its_secrets_redacted(tmp_path):
    spec = {"name": "e", "base": {"flags": {"api-key": "sk-live-1", "tp": 2},
                                  "env": {"HF_TOKEN": "hf_abc", "DATABASE_URL": "postgres://u:pw9@db/x"}},
            "arms": {"b": {"flags": {"hf-token": "hf_def"}}},
            "command": ["python", "-m", "srv", "--admin-api-key", "adm-2"],
            "workload": {"max_tokens": 16, "sessions": 4, "session_concurrency": 2}}
    with Store(tmp_path / "r.db") as st:
        assert st.ensure_experiment("e", spec, "h") is False
        assert st.ensure_experiment("e", spec, "h") is True      # the resume's update too
        stored = st.experiment("e")
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())   # db, WAL
    for secret in (b"sk-live-1", b"hf_abc", b"pw9", b"hf_def", b"adm-2"):
        assert secret not in raw
    assert stored["base"]["flags"] == {"api-key": "<redacted>", "tp": 2}
    assert stored["workload"] == spec["workload"]
    assert stored["base"]["env"]["DATABASE_URL"] == "postgres://<redacted>@db/x"


def test_telemetry_side_file_roundtrip_and_missing_is_none(tmp_path):
    db = tmp_path / "r.db"
    series = {"version": 1, "server": {"t_s": [0.0, 1.0], "series": {"queued_requests": [0, 3]}},
              "gpu": {"status": "n/a: no NVIDIA GPU"}}
    with Store(db) as st:
        with_tel = st.add_load_point(summary={}, provenance={}, load_key="rate=4",
                                     requests=[{"a": 1}], telemetry=series)
        without = st.add_load_point(summary={}, provenance={}, load_key="rate=8", requests=[])
        row = st.load_point(with_tel)
        assert row.telemetry_path and row.telemetry_path.endswith(".telemetry.json.gz")
        assert (db.parent / row.telemetry_path).exists()
        assert st.telemetry(row) == series
        assert st.load_point(without).telemetry_path is None
        assert st.telemetry(st.load_point(without)) is None
        # the file gone: one line that says the summary is intact
        (db.parent / row.telemetry_path).unlink()
        with pytest.raises(UserError, match="telemetry of load point .* is missing.*intact"):
            st.telemetry(row)
        # a transaction that fails removes its telemetry file too
        with pytest.raises(RuntimeError), st.transaction():
            st.add_load_point(summary={}, provenance={}, load_key="c=1", telemetry=series)
            raise RuntimeError("second row failed")
        assert not list(st.requests_dir.glob("*.telemetry.json.gz"))


# the load_points table as the release before telemetry wrote it (schema version 1)
_SCHEMA_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema_version', '1');
CREATE TABLE load_points (
    id INTEGER PRIMARY KEY AUTOINCREMENT, created REAL NOT NULL, source TEXT NOT NULL,
    label TEXT, base_url TEXT, model TEXT, load_key TEXT NOT NULL, concurrency INTEGER,
    request_rate REAL, summary TEXT NOT NULL, provenance TEXT NOT NULL, requests_path TEXT);
INSERT INTO load_points(created, source, load_key, summary, provenance)
    VALUES (1.0, 'bench', 'c=8', '{"completed": 3}', '{}');
"""


def test_a_store_of_the_previous_release_opens_reads_and_takes_telemetry(tmp_path):
    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    con.executescript(_SCHEMA_1)
    con.close()
    with Store(db, readonly=True) as st:  # `results list` opens it first
        old = st.load_points()[0]
        assert old.summary == {"completed": 3} and old.telemetry_path is None
        assert st.telemetry(old) is None
    with Store(db) as st:
        new = st.add_load_point(summary={}, provenance={}, load_key="c=1", telemetry={"v": 1})
        assert st.telemetry(st.load_point(new)) == {"v": 1}
        assert [r.load_key for r in st.load_points()] == ["c=1", "c=8"]
    con = sqlite3.connect(db)
    assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "2"
