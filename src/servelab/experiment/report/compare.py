"""`servelab compare A B`: two bench results (store load-point ids or `bench --output` files),
metric by metric, B relative to A.

Latency medians get a bootstrap CI over requests when the per-request records are at hand; a
single run per side cannot separate the machine's run-to-run noise from the change, so that CI is
only indicative, and throughput (one number per run) gets none: use `servelab run` to decide.
Workload fields that differ between the sides are reported: such results do not compare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from servelab.bench.importers import protocol_of
from servelab.errors import UserError
from servelab.experiment.design.metrics import path_value
from servelab.experiment.stats.bootstrap import bootstrap_ratio
from servelab.experiment.stats.bootstrap import verdict as ci_verdict
from servelab.store import Store

# (summary key, sub-key or None, label, higher is better, per-request record field)
_ROWS: tuple[tuple[str, str | None, str, bool | None, str | None], ...] = (
    ("output_throughput_tok_s", None, "output throughput (tok/s)", True, None),
    ("request_throughput_req_s", None, "request throughput (req/s)", True, None),
    ("total_throughput_tok_s", None, "total throughput (tok/s)", True, None),
    ("goodput_req_s", None, "goodput (req/s)", True, None),
    ("ttft_ms", "median", "TTFT median (ms)", False, "ttft_ms"),
    ("ttft_ms", "p99", "TTFT p99 (ms)", False, None),
    ("tpot_ms", "median", "TPOT median (ms)", False, "tpot_ms"),
    ("tpot_ms", "p99", "TPOT p99 (ms)", False, None),
    ("itl_ms", "median", "ITL median (ms)", False, None),
    ("e2e_ms", "median", "E2E median (ms)", False, "e2e_ms"),
    ("accept_length", None, "acceptance length", None, None),
    ("completed", None, "completed requests", None, None),
    ("failed", None, "failed requests", None, None),
)
_CHECKED = ("input_len", "output_len", "dataset", "num_prompts", "protocol", "seed")


@dataclass
class Side:
    name: str
    points: dict[
        str, tuple[dict[str, Any], list[dict[str, Any]] | None]
    ]  # load key -> (summary, records)


@dataclass
class CompareResult:
    a_name: str
    b_name: str
    load_key: str
    rows: list[list[str]]
    warnings: list[str] = field(default_factory=list)


def _side(store: Store, ref: str) -> Side:
    if ref.isdigit():
        lp = store.load_point(int(ref))
        return Side(
            f"#{lp.id} {lp.label or lp.source}",
            {lp.load_key: (lp.summary, list(store.requests(lp)))},
        )
    path = Path(ref)
    if not path.is_file():
        raise UserError(
            f"'{ref}' is neither a load point id nor a file; give an id from "
            "`servelab results list` or a `servelab bench --output` JSON file"
        )
    try:
        doc = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise UserError(f"{path} is not JSON ({exc})") from None
    except OSError as exc:
        raise UserError(f"{path} cannot be read ({exc.strerror})") from None
    if isinstance(doc, dict) and isinstance(doc.get("load_points"), list):
        items = doc["load_points"]
    elif isinstance(doc, dict) and "output_throughput_tok_s" in doc:
        items = [doc]
    elif isinstance(doc, list):
        items = doc
    else:
        raise UserError(f"{path}: no load points found (expected `servelab bench --output` JSON)")
    points: dict[str, tuple[dict[str, Any], list[dict[str, Any]] | None]] = {}
    for s in items:
        if not isinstance(s, dict):
            raise UserError(f"{path}: a load point is {type(s).__name__}, not an object; "
                            "expected `servelab bench --output` JSON")
        key = s.get("load_key") or (f"c={s['concurrency']}" if s.get("concurrency") else "?")
        recs = None
        if s.get("store_id"):
            try:
                recs = list(store.requests(store.load_point(int(s["store_id"]))))
            except UserError:
                recs = None
        points[key] = (s, recs)
    return Side(path.name, points)


def _fmt(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.4g}"


def _protocol(s: dict[str, Any]) -> str | None:
    return s.get("protocol") or protocol_of(s.get("api"))


def check_noise_band(noise_band: Any) -> float:
    """The noise band as a fraction in [0, 1): a negative one turned "better" into "worse" and
    NaN turned +21% into "within noise"."""
    if isinstance(noise_band, bool) or not isinstance(noise_band, int | float) or not (
            math.isfinite(noise_band) and 0 <= noise_band < 1):
        raise UserError(f"--noise-band must be a fraction in [0, 1), e.g. 0.02 for +-2%; got "
                        f"{noise_band}")
    return float(noise_band)


def compare(store: Store, a: str, b: str, *, noise_band: float = 0.02) -> CompareResult:
    """B relative to A for every load point the two share (or the single one of each)."""
    noise_band = check_noise_band(noise_band)
    sa, sb = _side(store, a), _side(store, b)
    warnings: list[str] = []
    keys = [k for k in sa.points if k in sb.points]
    pairs = [(k, sa.points[k], sb.points[k]) for k in keys]
    if not pairs and len(sa.points) == 1 and len(sb.points) == 1:
        (ka, pa), (kb, pb) = next(iter(sa.points.items())), next(iter(sb.points.items()))
        warnings.append(f"different load points: A is {ka}, B is {kb}")
        pairs = [(f"{ka} vs {kb}", pa, pb)]
    if not pairs:
        raise UserError(
            f"A and B share no load point (A: {', '.join(sa.points)}; B: {', '.join(sb.points)})"
        )
    rows = [["load", "metric", "A", "B", "B/A", "change [95% CI over requests]", "verdict"]]
    for key, (sum_a, rec_a), (sum_b, rec_b) in pairs:
        for f in _CHECKED:
            if f == "protocol":  # the wire protocol, whichever tool spoke it (vllm == openai)
                pa, pb = _protocol(sum_a), _protocol(sum_b)
                if pa != pb:
                    warnings.append(f"{key}: protocol differs: {pa or 'unknown'} in A, "
                                    f"{pb or 'unknown'} in B; these results do not compare")
                continue
            if sum_a.get(f) != sum_b.get(f):
                warnings.append(
                    f"{key}: workload differs: {f} is {sum_a.get(f)!r} in A, "
                    f"{sum_b.get(f)!r} in B; these results do not compare"
                )
        for skey, sub, label, higher, field_ in _ROWS:
            path = (skey,) if sub is None else (skey, sub)
            va, vb = path_value(sum_a, path), path_value(sum_b, path)
            ratio = vb / va if math.isfinite(va) and math.isfinite(vb) and va else math.nan
            change, verdict = "n/a" if math.isnan(ratio) else f"{(ratio - 1) * 100:+.1f}%", ""
            if field_ and rec_a and rec_b and higher is not None:
                xa = [r[field_] for r in rec_a if isinstance(r.get(field_), int | float)]
                xb = [r[field_] for r in rec_b if isinstance(r.get(field_), int | float)]
                boot, lo, hi = bootstrap_ratio(xa, xb, paired=False, n_boot=4000)
                if math.isfinite(lo):
                    change += f" [{(lo - 1) * 100:+.1f}%, {(hi - 1) * 100:+.1f}%]"
                    verdict = ci_verdict(boot, lo, hi, noise_band, higher)
            elif higher is not None and math.isfinite(ratio):
                beyond = abs(ratio - 1) > noise_band
                verdict = (
                    (("better" if (ratio > 1) == higher else "worse") + " (1 run, no CI)")
                    if beyond
                    else "within noise"
                )
            rows.append([key, label, _fmt(va), _fmt(vb), _fmt(ratio), change, verdict])
    if sa.points and sb.points and len(pairs) < max(len(sa.points), len(sb.points)):
        warnings.append("load points present on one side only were left out")
    return CompareResult(sa.name, sb.name, ", ".join(k for k, *_ in pairs), rows, warnings)
