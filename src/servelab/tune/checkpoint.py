"""Append-only JSONL checkpoint of a tuning job: every measurement as it is made.

Records (one JSON object a line, key "t"):
  start  a (re)start of the job, with its command line
  m      one config timed on one (N, K, M): {ctx, n, k, m, cfg, us, spread, reps, err}
  unit   one (N, K, M) finished: {ctx, search, n, k, m, best, us, default_us, timed, ...}
  fail   one (N, K, M) given up after repeated worker crashes
`ctx` names what makes measurements comparable (device, timing method, Triton version, space);
a unit counts as done only for the same ctx and search. A line torn by a kill is skipped, and
the next append starts on a fresh line. Only the job's parent process writes the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab import atomic

FILE_NAME = "tune-checkpoint.jsonl"


def context_id(**parts: Any) -> str:
    """A short stable hash of what makes measurements comparable."""
    blob = json.dumps(parts, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass
class State:
    """What a checkpoint holds for one context: measurements per unit, finished units."""

    measurements: dict[tuple[int, int, int], dict[str, dict[str, Any]]] = field(default_factory=dict)
    units: dict[tuple[int, int, int], dict[str, Any]] = field(default_factory=dict)
    starts: int = 0
    torn_lines: int = 0


def read_records(path: Path) -> Iterator[dict[str, Any] | None]:
    """Each line's record, or None for a line that does not parse (torn by a kill)."""
    if not path.exists():
        return
    with open(path, "rb") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                yield None
                continue
            yield rec if isinstance(rec, dict) else None


class Checkpoint:
    """The checkpoint file of one output folder."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f = None

    def load(self, ctx: str, search: str) -> State:
        """Measurements made under `ctx` (highest reps kept per config) and units done with `search`."""
        st = State()
        for rec in read_records(self.path):
            if rec is None:
                st.torn_lines += 1
                continue
            t = rec.get("t")
            if t == "start":
                st.starts += 1
            if rec.get("ctx") != ctx:
                continue
            key = (rec.get("n"), rec.get("k"), rec.get("m"))
            if t == "m":
                per = st.measurements.setdefault(key, {})
                old = per.get(rec["cfg_key"])
                if old is None or (rec.get("reps") or 0) >= (old.get("reps") or 0):
                    per[rec["cfg_key"]] = rec
            elif t == "unit" and rec.get("search") == search:
                st.units[key] = rec
        return st

    def append(self, rec: dict[str, Any], sync: bool = False) -> None:
        """Append one record; `sync` also fsyncs (used for unit records)."""
        if self._f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = atomic.open_append(self.path, private=False)
            if self._f.tell() > 0:
                with open(self.path, "rb") as r:
                    r.seek(-1, os.SEEK_END)
                    if r.read(1) != b"\n":
                        self._f.write(b"\n")       # a kill tore the last line: start a new one
        self._f.write(json.dumps(rec, separators=(",", ":")).encode() + b"\n")
        self._f.flush()
        if sync:
            os.fsync(self._f.fileno())

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
