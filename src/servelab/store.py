"""The results store: SQLite (WAL) for load points, experiments and runs; per-request records as
gzip-compressed JSONL files beside the database.

One row per load point holds its summary (the `--output` JSON object of docs/METRICS.md) and its
provenance. Experiments add a `runs` table: one row per (arm, load point, repetition), the unit of
statistics, written as each run finishes so an interrupted experiment resumes where it stopped.

Integrity: a store is checked (`PRAGMA quick_check`) when opened; one that fails is refused for
writing with a one-line error that says how to recover (rows written into a damaged file may be
lost or read back wrong). Reading a damaged store fails with the same one line, never a
traceback. Several rows that belong together (one imported file) are written in one transaction
(`Store.transaction`): all of them or none, per-request files included. Provenance and run logs
are redacted (servelab.redaction.redact) before they are stored.
"""

from __future__ import annotations

import contextlib
import gzip
import sqlite3
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from servelab import paths
from servelab.errors import UserError
from servelab.redaction import redact, redact_text

SCHEMA_VERSION = 2  # 2: load_points.telemetry_path (a version-1 store gains it when opened)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS load_points (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    created       REAL NOT NULL,          -- unix seconds
    source        TEXT NOT NULL,          -- 'bench', 'experiment', 'import:sglang', 'import:vllm'
    label         TEXT,                   -- free name (bench --label, experiment arm, import file)
    base_url      TEXT,
    model         TEXT,
    load_key      TEXT NOT NULL,          -- 'c=8' (closed loop) or 'rate=4' (open loop)
    concurrency   INTEGER,
    request_rate  REAL,
    summary       TEXT NOT NULL,          -- JSON: the per-load-point object of docs/METRICS.md
    provenance    TEXT NOT NULL,          -- JSON: see servelab.provenance
    requests_path TEXT,                   -- gzip JSONL of per-request records, relative to the db
    telemetry_path TEXT                   -- gzip JSON of the series over the load, relative
);
CREATE TABLE IF NOT EXISTS experiments (
    name     TEXT PRIMARY KEY,
    created  REAL NOT NULL,
    spec     TEXT NOT NULL,               -- JSON of the validated experiment file
    spec_hash TEXT NOT NULL               -- a changed file under the same name is refused
);
CREATE TABLE IF NOT EXISTS runs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    experiment    TEXT NOT NULL REFERENCES experiments(name),
    arm           TEXT NOT NULL,
    load_key      TEXT NOT NULL,
    repetition    INTEGER NOT NULL,
    block         INTEGER,
    seq           INTEGER,                -- position in the schedule
    status        TEXT NOT NULL,          -- 'ok' or 'failed'
    load_point_id INTEGER REFERENCES load_points(id),
    error         TEXT,
    log_tail      TEXT,
    started       REAL,
    finished      REAL,
    UNIQUE (experiment, arm, load_key, repetition)
);
CREATE INDEX IF NOT EXISTS runs_by_experiment ON runs(experiment);
CREATE TABLE IF NOT EXISTS imports (
    sha256   TEXT PRIMARY KEY,            -- of the imported file's bytes: a re-import is refused
    kind     TEXT NOT NULL,
    path     TEXT NOT NULL,
    created  REAL NOT NULL,
    ids      TEXT NOT NULL                -- JSON list of the load point ids it created
);
"""


def recovery_hint(path: Path) -> str:
    return (f"move it aside (mv {path} {path}.damaged) and start a new store, or salvage its "
            f"rows with `sqlite3 {path} .recover | sqlite3 {path.with_suffix('.recovered.db')}`"
            " and pass --store with that file")


@dataclass(frozen=True, slots=True)
class LoadPointRow:
    id: int
    created: float
    source: str
    label: str | None
    base_url: str | None
    model: str | None
    load_key: str
    concurrency: int | None
    request_rate: float | None
    summary: dict[str, Any]
    provenance: dict[str, Any]
    requests_path: str | None
    telemetry_path: str | None = None


@dataclass(frozen=True, slots=True)
class RunRow:
    id: int
    experiment: str
    arm: str
    load_key: str
    repetition: int
    block: int | None
    seq: int | None
    status: str
    load_point_id: int | None
    error: str | None
    log_tail: str | None
    started: float | None
    finished: float | None


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()


class Store:
    """A results store at `path` (default: `$SERVELAB_HOME/results.db`). Safe for one writer and
    many readers at once (WAL); every write is its own transaction, so a crash loses at most the
    row being written."""

    def __init__(self, path: str | Path | None = None, *, readonly: bool = False) -> None:
        self.path = Path(path) if path else paths.default_store()
        if self.path.is_dir():
            raise UserError(f"results store {self.path} is a folder; pass --store with a file "
                            f"name, e.g. {self.path / 'results.db'}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"results store {self.path}: cannot create its folder "
                            f"({exc.strerror})") from None
        self.requests_dir = self.path.parent / (self.path.stem + "-requests")
        self._new_files: list[Path] | None = None  # per-request files of the open transaction
        try:
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            self._db.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
        except sqlite3.DatabaseError as exc:
            raise UserError(f"results store {self.path} is not usable ({exc}); "
                            f"{recovery_hint(self.path)}") from None
        self.damage = self._integrity()
        self._migrate(readonly)
        if self.damage and not readonly:
            raise UserError(f"results store {self.path} failed its integrity check "
                            f"({self.damage}); it is refused for writing: "
                            f"{recovery_hint(self.path)}")

    def _migrate(self, readonly: bool) -> None:
        """A store written before telemetry side files (schema 1) gains their column; its rows
        read it as None. A damaged store opened to read is left as it is (its rows read None
        too: `_lp` takes what the row has)."""
        try:
            cols = {r[1] for r in self._db.execute("PRAGMA table_info(load_points)")}
            if "telemetry_path" not in cols:
                self._db.execute("ALTER TABLE load_points ADD COLUMN telemetry_path TEXT")
                self._db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                                 (str(SCHEMA_VERSION),))
        except sqlite3.DatabaseError:
            if not readonly:
                raise

    def _integrity(self) -> str | None:
        """None when SQLite's quick_check passes, else its first complaint."""
        try:
            rows = self._db.execute("PRAGMA quick_check").fetchall()
        except sqlite3.DatabaseError as exc:
            return str(exc)
        first = rows[0][0] if rows else "no answer"
        return None if first == "ok" else " ".join(str(first).split())[:200]

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[tuple]:
        """A read; a damaged file gives the one-line error with the recovery hint."""
        try:
            return self._db.execute(sql, tuple(args)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise UserError(f"results store {self.path} cannot be read ({exc}); "
                            f"{recovery_hint(self.path)}") from None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Store]:
        """Writes inside are committed together or not at all (per-request files too)."""
        if self._new_files is not None:
            raise RuntimeError("transactions do not nest")
        self._db.execute("BEGIN IMMEDIATE")
        self._new_files = []
        try:
            yield self
        except BaseException:
            self._db.execute("ROLLBACK")
            for f in self._new_files:
                f.unlink(missing_ok=True)
            raise
        else:
            self._db.execute("COMMIT")
        finally:
            self._new_files = None

    # ---- imports -----------------------------------------------------------------------------

    def imported(self, sha256: str) -> tuple[str, list[int]] | None:
        """(path, load point ids) of an earlier import of the same bytes, or None."""
        rows = self._query("SELECT path, ids FROM imports WHERE sha256 = ?", (sha256,))
        return (rows[0][0], orjson.loads(rows[0][1])) if rows else None

    def add_import(self, sha256: str, kind: str, path: str, ids: list[int]) -> None:
        self._db.execute("INSERT INTO imports(sha256, kind, path, created, ids) VALUES (?,?,?,?,?)",
                         (sha256, kind, path, time.time(), _dumps(ids)))

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- load points -------------------------------------------------------------------------

    def add_load_point(
        self,
        *,
        summary: dict[str, Any],
        provenance: dict[str, Any],
        load_key: str,
        source: str = "bench",
        label: str | None = None,
        base_url: str | None = None,
        model: str | None = None,
        concurrency: int | None = None,
        request_rate: float | None = None,
        requests: Iterable[dict[str, Any]] | None = None,
        telemetry: dict[str, Any] | None = None,
    ) -> int:
        """Store one load point; `requests` (per-request records as dicts) go to a gzip JSONL file
        and `telemetry` (the series over the load, telemetry/point.py) to a gzip JSON file beside
        it, both written before the row, so a row never points at a missing file."""
        stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{time.monotonic_ns() % 10**9:09d}"
        rel = tel = None
        if requests is not None:
            rel = self._side_file(stem + ".jsonl.gz", (
                orjson.dumps(rec, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n" for rec in requests))
        if telemetry is not None:
            tel = self._side_file(stem + ".telemetry.json.gz", (orjson.dumps(
                telemetry, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS),))
        cur = self._db.execute(
            "INSERT INTO load_points(created, source, label, base_url, model, load_key, concurrency,"
            " request_rate, summary, provenance, requests_path, telemetry_path)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                time.time(), source, label, base_url, model, load_key, concurrency, request_rate,
                _dumps(summary), _dumps(redact(provenance)), rel, tel,
            ),
        )
        return int(cur.lastrowid)

    def _side_file(self, name: str, chunks: Iterable[bytes]) -> str:
        """Write a gzip file into the requests folder atomically; its path relative to the db."""
        self.requests_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.requests_dir / (name + ".tmp")
        with gzip.open(tmp, "wb") as f:
            for c in chunks:
                f.write(c)
        tmp.replace(self.requests_dir / name)
        if self._new_files is not None:
            self._new_files.append(self.requests_dir / name)
        return f"{self.requests_dir.name}/{name}"

    def load_point(self, lp_id: int) -> LoadPointRow:
        # an id beyond SQLite's 64-bit integers names no row (binding it would overflow)
        rows = (self._query("SELECT * FROM load_points WHERE id = ?", (lp_id,))
                if -(1 << 63) <= lp_id < (1 << 63) else [])
        row = rows[0] if rows else None
        if row is None:
            raise UserError(f"no load point with id {lp_id} in {self.path}; `servelab results list` shows the ids")
        return self._lp(row)

    def load_points(self, *, source: str | None = None, limit: int | None = None) -> list[LoadPointRow]:
        q = "SELECT * FROM load_points"
        args: list[Any] = []
        if source:
            q += " WHERE source = ?"
            args.append(source)
        q += " ORDER BY id DESC"
        if limit:
            q += f" LIMIT {int(limit)}"
        return [self._lp(r) for r in self._query(q, args)]

    def requests_file(self, lp: LoadPointRow) -> Path | None:
        """Where a load point's per-request records are kept (None when none were kept)."""
        return self.path.parent / lp.requests_path if lp.requests_path else None

    def requests(self, lp: LoadPointRow) -> Iterator[dict[str, Any]]:
        """The per-request records of a load point (empty when none were kept); UserError when
        their file is gone (the load point's summary in the database is intact)."""
        path = self.requests_file(lp)
        if path is None:
            return iter(())
        if not path.exists():
            raise UserError(f"the per-request records of load point {lp.id} are missing: {path} "
                            f"(moved or deleted); its summary is intact")

        def gen() -> Iterator[dict[str, Any]]:
            try:
                with gzip.open(path, "rb") as f:
                    for line in f:
                        yield orjson.loads(line)
            except (OSError, EOFError, zlib.error, orjson.JSONDecodeError) as exc:
                raise UserError(f"the per-request records of load point {lp.id} are unreadable: "
                                f"{path}: {exc}; its summary is intact") from None

        return gen()

    def telemetry(self, lp: LoadPointRow) -> dict[str, Any] | None:
        """The series stored over a load point (telemetry/point.py), None when none was kept
        (telemetry off, an import, a store of an earlier release); UserError when its file is
        gone or unreadable (the summary in the database is intact)."""
        if not lp.telemetry_path:
            return None
        path = self.path.parent / lp.telemetry_path
        try:
            with gzip.open(path, "rb") as f:
                return orjson.loads(f.read())
        except FileNotFoundError:
            raise UserError(f"the telemetry of load point {lp.id} is missing: {path} (moved or "
                            "deleted); its summary is intact") from None
        except (OSError, EOFError, zlib.error, orjson.JSONDecodeError) as exc:
            raise UserError(f"the telemetry of load point {lp.id} is unreadable: {path}: {exc}; "
                            "its summary is intact") from None

    @staticmethod
    def _lp(r: tuple) -> LoadPointRow:
        try:
            summary, prov = orjson.loads(r[9]), orjson.loads(r[10])
        except (orjson.JSONDecodeError, TypeError) as exc:
            raise UserError(f"load point {r[0]}: its stored summary is damaged ({exc}); "
                            "`servelab results list` shows the others") from None
        return LoadPointRow(
            id=r[0], created=r[1], source=r[2], label=r[3], base_url=r[4], model=r[5], load_key=r[6],
            concurrency=r[7], request_rate=r[8], summary=summary,
            provenance=prov, requests_path=r[11], telemetry_path=r[12] if len(r) > 12 else None,
        )

    # ---- experiments and runs ----------------------------------------------------------------

    def ensure_experiment(self, name: str, spec: dict[str, Any], spec_hash: str,
                          also: tuple[str, ...] = ()) -> bool:
        """Register an experiment; returns True when it already existed (a resume). The same name
        with a different spec is refused: results of two designs must not be mixed. `also`: the
        hashes earlier releases gave the same design (accepted, and the stored hash becomes
        `spec_hash`)."""
        row = self._db.execute("SELECT spec_hash FROM experiments WHERE name = ?", (name,)).fetchone()
        if row is not None:
            if row[0] != spec_hash and row[0] in also:
                self._db.execute("UPDATE experiments SET spec_hash = ? WHERE name = ?",
                                 (spec_hash, name))
            elif row[0] != spec_hash:
                raise UserError(
                    f"experiment '{name}' already exists in {self.path} with a different design; "
                    "rename it in the file, or run it with `servelab run FILE --fresh` to start over"
                )
            # same design: keep what may change between resumes (hypothesis, noise band) current
            self._db.execute("UPDATE experiments SET spec = ? WHERE name = ?",
                             (_dumps(redact(spec)), name))
            return True
        # stored redacted: reports, --json and the HTML read this copy, never the secrets
        self._db.execute(
            "INSERT INTO experiments(name, created, spec, spec_hash) VALUES (?,?,?,?)",
            (name, time.time(), _dumps(redact(spec)), spec_hash),
        )
        return False

    def experiment(self, name: str) -> dict[str, Any]:
        row = self._db.execute("SELECT spec FROM experiments WHERE name = ?", (name,)).fetchone()
        if row is None:
            known = ", ".join(self.experiment_names()) or "none"
            raise UserError(f"no experiment named '{name}' in {self.path} (known: {known})")
        return orjson.loads(row[0])

    def experiment_names(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT name FROM experiments ORDER BY created")]

    def forget_experiment(self, name: str) -> None:
        self._db.execute("BEGIN")
        self._db.execute("DELETE FROM runs WHERE experiment = ?", (name,))
        self._db.execute("DELETE FROM experiments WHERE name = ?", (name,))
        self._db.execute("COMMIT")

    def add_run(
        self,
        *,
        experiment: str,
        arm: str,
        load_key: str,
        repetition: int,
        status: str,
        block: int | None = None,
        seq: int | None = None,
        load_point_id: int | None = None,
        error: str | None = None,
        log_tail: str | None = None,
        started: float | None = None,
        finished: float | None = None,
    ) -> int:
        """Record a finished run (ok or failed). A failed run is replaced when it is retried later."""
        if status not in ("ok", "failed"):
            raise ValueError(f"run status must be 'ok' or 'failed', not {status!r}")
        cur = self._db.execute(
            "INSERT OR REPLACE INTO runs(experiment, arm, load_key, repetition, block, seq, status,"
            " load_point_id, error, log_tail, started, finished) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (experiment, arm, load_key, repetition, block, seq, status, load_point_id,
             redact_text(error), redact_text(log_tail), started,
             finished if finished is not None else time.time()),
        )
        return int(cur.lastrowid)

    def runs(self, experiment: str) -> list[RunRow]:
        rows = self._query(
            "SELECT id, experiment, arm, load_key, repetition, block, seq, status, load_point_id,"
            " error, log_tail, started, finished FROM runs WHERE experiment = ? ORDER BY seq, id",
            (experiment,),
        )
        return [RunRow(*r) for r in rows]
