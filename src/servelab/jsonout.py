"""`--json`: every CLI verb that prints a result can print it as ONE JSON document on stdout
instead (its human text then goes to stderr), so scripts never parse tables. The documents and
their schema are described in docs/JSON.md; this module is the one place they are built, below
the CLI, so each verb only adds the option and one call.

Conventions (docs/JSON.md): a top-level `schema` ("servelab.<kind>/<version>"); units in key
names (`ttft_ms`, `tok_s`); missing measurements and non-finite numbers are `null`, never 0;
times are Unix seconds (`*_unix`) beside UTC text where people read them.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import orjson

from servelab.console import json_text

VERSION = 1
KINDS = ("bench", "load_points", "load_point", "import", "compare", "jobs", "experiment",
         "tune", "tune_verify", "tune_install", "profile", "ceiling", "experiment_check")


def _clean(obj: Any) -> Any:
    """JSON-able: dataclasses as dicts, paths as text, non-finite floats as None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if is_dataclass(obj) and not isinstance(obj, type):
        return _clean(asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set):
        return [_clean(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _clean(obj.item())
    return obj


def document(kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """`body` under the schema tag of `kind`."""
    if kind not in KINDS:
        raise ValueError(f"unknown JSON kind {kind!r}")
    return {"schema": f"servelab.{kind}/{VERSION}", **_clean(dict(body))}


def dumps(doc: Any) -> str:
    """Indented JSON, safe for a terminal (DEL, C1 and bidi overrides escaped: same value)."""
    return json_text(orjson.dumps(_clean(doc), option=orjson.OPT_INDENT_2, default=str).decode())


def emit(kind: str, body: Mapping[str, Any]) -> None:
    """Print the document on stdout (one document per command)."""
    sys.stdout.write(dumps(document(kind, body)) + "\n")
    sys.stdout.flush()


# ---- builders ------------------------------------------------------------------------------------


def load_point(row: Any, requests: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One stored load point (`servelab results show`)."""
    doc = {"id": row.id, "created_unix": row.created, "source": row.source, "label": row.label,
           "base_url": row.base_url, "model": row.model, "load_key": row.load_key,
           "concurrency": row.concurrency, "request_rate": row.request_rate,
           "summary": row.summary, "provenance": row.provenance}
    if requests is not None:
        doc["requests"] = requests
    return doc


def load_points(rows: Iterable[Any]) -> dict[str, Any]:
    """`servelab results list`: the rows without provenance (ask `results show` for it)."""
    out = []
    for r in rows:
        d = load_point(r)
        d.pop("provenance")
        out.append(d)
    return {"load_points": out}


def jobs(states: Sequence[Any], now: float) -> dict[str, Any]:
    """`servelab status`: every job's state, with elapsed seconds."""
    out = []
    for s in states:
        d = asdict(s)
        end = s.updated if s.state != "running" else now
        d["elapsed_s"] = end - s.started
        d["eta_s"] = s.eta_s if s.state == "running" else None
        out.append(d)
    return {"jobs": out}


def _num(text: str) -> float | None:
    try:
        x = float(text)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def compare(res: Any, noise_band: float) -> dict[str, Any]:
    """`servelab compare A B`: one row per load point and metric (values as printed: 4
    significant digits; `change` and `verdict` as text)."""
    rows = []
    for r in res.rows[1:]:
        load, metric, a, b, ratio, change, verdict = r
        rows.append({"load": load, "metric": metric, "a": _num(a), "b": _num(b),
                     "ratio": _num(ratio), "change": change, "verdict": verdict or None})
    return {"a": res.a_name, "b": res.b_name, "load_key": res.load_key, "noise_band": noise_band,
            "rows": rows, "warnings": list(res.warnings)}


def tune_verify(checks: Sequence[Any], rows: Sequence[Any], device: str,
                geomean: float | None, geomean_vs_shipped: float | None = None,
                kernel: str | None = None) -> dict[str, Any]:
    """`servelab tune verify`: each file's check and each (N, K, M) re-timed (tuned vs the
    engine's shipped config vs its default), and which kernel was timed."""
    return {"device": device, "kernel": kernel,
            "files": [{"path": c.path, "format": c.fmt, "n": c.n, "k": c.k, "tuned_on": c.device,
                       "batch_sizes": list(c.entries), "missing_default": list(c.missing_default)}
                      for c in checks],
            "rows": [{**asdict(r), "speedup": r.speedup, "vs_shipped": r.vs_shipped}
                     for r in rows],
            "geomean_speedup": geomean, "geomean_vs_shipped": geomean_vs_shipped}


def tune(rep: Any, spec: Any) -> dict[str, Any]:
    """`servelab tune fp8-gemm`: every (N, K, M) tuned (its best config in the engines' key
    names, its time and the baseline's), the failures, the files written."""
    points = []
    for (n, k, m), u in sorted(rep.units.items()):
        us, base = u.get("us"), u.get("default_us")
        points.append({"n": n, "k": k, "m": m, "config": u.get("best"), "time_us": us,
                       "baseline": u.get("baseline"), "baseline_us": base,
                       "speedup": base / us if us and base else None, "kernel": u.get("kernel"),
                       "timed": u.get("timed"), "candidates": u.get("candidates")})
    failed = [{"n": f.get("n"), "k": f.get("k"), "m": f.get("m"),
               "error": (str(f.get("error", "")).strip().splitlines() or [""])[-1]}
              for f in rep.failed]
    return {"device": rep.device_name, "out_dir": spec.out_dir, "search": spec.search,
            "formats": list(spec.formats), "seconds": rep.seconds,
            "resumed_points": rep.resumed_units, "points": points,
            "failed": failed,
            "files": list(rep.files), "notes": list(rep.notes)}


def tune_install(engine: str, folder: Path, installed: Sequence[Any], restored: bool,
                 lookup: Mapping[str, Any] | None, undo: str | None,
                 not_restored: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """`servelab tune install`: the files put in place (or put back with --restore), what
    the engine's own lookup found, and (restore) the entries it could not put back, with why."""
    doc = {"engine": engine, "folder": folder, "action": "restore" if restored else "install",
           "files": [{"path": folder / f.name, "replaced": f.replaced} for f in installed],
           "lookup": dict(lookup) if lookup is not None else None, "undo": undo}
    if restored:
        doc["not_restored"] = [{"name": n, "why": w} for n, w in not_restored]
    return doc
