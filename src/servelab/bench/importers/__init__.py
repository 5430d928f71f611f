"""Bring other tools' result files into the store, their names mapped to ours
(docs/METRICS.md has the tables): one module per tool, each turning a file into `Entry`s
(load points), and one store path for all of them here.

An import is all or nothing and idempotent: every entry of the file is validated (types, finite
non-negative numbers, bounded counts, per-request lists of one length) before anything is
stored; the rows are then written in one transaction together with the file's SHA-256, so the
same file imported again is reported as such instead of stored twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servelab import provenance
from servelab.bench.importers import aiperf, engines, guidellm, llmperf
from servelab.bench.importers.common import (
    PROTOCOLS,
    Bad,
    Entry,
    load_objects,
    protocol_of,
    read_json,
)
from servelab.errors import UserError

__all__ = ["KINDS", "PROTOCOLS", "import_file", "protocol_of"]


def _engine(kind: str) -> Callable[[Path], tuple[list[Entry], bytes]]:
    def read(p: Path) -> tuple[list[Entry], bytes]:
        objs, data = load_objects(p)
        return engines.parse(kind, objs), data
    return read


def _json(parse: Callable[[Any, Path], list[Entry]]) -> Callable[[Path], tuple[list[Entry], bytes]]:
    def read(p: Path) -> tuple[list[Entry], bytes]:
        doc, data = read_json(p)
        return parse(doc, p), data
    return read


# kind -> reader of a file: (entries, the bytes whose SHA-256 makes the import idempotent)
KINDS: dict[str, Callable[[Path], tuple[list[Entry], bytes]]] = {
    "sglang": _engine("sglang"),
    "vllm": _engine("vllm"),
    "guidellm": _json(guidellm.parse),
    "aiperf": aiperf.read_aiperf,
    "genai-perf": _json(aiperf.parse_genai_perf),
    "llmperf": llmperf.read,
}


def import_file(store: Any, kind: str, path: str | Path,
                label: str | None = None) -> tuple[list[int], bool]:
    """Import every result in the file as one load point each, all or none. Returns the row ids
    and whether the same bytes had been imported before (then nothing new is stored)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: no such file")
    reader = KINDS.get(kind)
    if reader is None:
        raise UserError(f"cannot import {kind!r} results; use {', '.join(KINDS)}")
    try:
        entries, data = reader(p)
    except Bad as exc:
        raise UserError(f"{p}: {exc}; nothing was imported") from None
    if not entries:
        raise UserError(f"{p}: no benchmark in it; nothing was imported")
    sha = hashlib.sha256(data).hexdigest()
    seen = store.imported(sha)
    if seen is not None:
        return seen[1], True
    rows = []
    for e in entries:
        prov = provenance.collect(imported_from=str(p.resolve()), import_kind=kind,
                                  import_sha256=sha, original_date=e.date,
                                  original_model=e.model, server_info=e.server_info)
        rows.append((e, prov))
    ids = []
    with store.transaction():
        for e, prov in rows:
            s = e.summary
            ids.append(store.add_load_point(
                summary=s, provenance=prov, load_key=s["load_key"], source=f"import:{kind}",
                label=label or p.name, model=e.model, concurrency=s["concurrency"],
                request_rate=s["request_rate"], requests=e.records or None,
            ))
        store.add_import(sha, kind, str(p.resolve()), ids)
    return ids, False
