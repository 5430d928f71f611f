"""The report's data: an experiment's evidence (stats/evidence.py, the one record of what was
measured and decided, so the report states what the runner decided with) plus the warnings
only the report gives (A/A arms, pooled machines, missing request files), and the per-request
values the distribution plots pool."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from servelab.errors import UserError
from servelab.experiment.design.model import ArmSpec
from servelab.experiment.stats import evidence
from servelab.experiment.stats.analysis import Analysis
from servelab.experiment.stats.evidence import Evidence
from servelab.store import Store


def collect(store: Store, name: str, noise_band: float | None = None) -> Evidence:
    """Everything stored about an experiment, with its statistics (evidence.gather: the same
    runs and rule the runner decided with), and the report's own warnings."""
    ev = evidence.gather(store, name, noise_band)
    runs, lps, an = ev.runs, ev.load_points, ev.analysis
    ok = [r for r in runs if r.status == "ok" and r.load_point_id in lps]
    an.warnings += aa_notes(ev.spec.arms, an, an.baseline, data_metric=ev.primary)
    an.warnings += mixed_provenance([lps[r.load_point_id].provenance for r in ok])
    gone = [r for r in ok if (f := store.requests_file(lps[r.load_point_id])) and not f.exists()]
    if gone:
        an.warnings.append(
            f"the per-request records of {len(gone)} of {len(ok)} runs are missing (files under "
            f"{store.path.parent / 'results-requests'} moved or deleted): the TTFT/TPOT "
            f"distribution plots leave them out; every table and effect uses the stored summaries"
        )
    return ev


def mixed_provenance(provs: list[dict[str, Any]]) -> list[str]:
    """Runs measured on different hosts, GPUs or servelab versions (e.g. a resume elsewhere)
    should not be pooled: say so."""
    out = []
    for key, label in (
        ("host", "hosts"),
        ("gpus", "GPU sets"),
        ("servelab_version", "servelab versions"),
    ):
        seen = {repr(p.get(key)) for p in provs}
        if len(seen) > 1:
            out.append(
                f"runs were measured on {len(seen)} different {label} ({', '.join(sorted(seen))}): "
                "results from different machines or software should not be pooled"
            )
    return out


def aa_notes(arms: Mapping[str, ArmSpec], an: Analysis, baseline: str, data_metric: str
             ) -> list[str]:
    """An arm identical to the baseline (the same recipe, flags, removals, env, roles and
    placement: its description aside) is an A/A arm: its 'effect' is the machine's own noise,
    which sizes the noise band. (An arm without a delta is no A/A arm when the baseline has one:
    the prefix-cache example's baseline turns the cache off.)"""
    def delta(a: ArmSpec) -> dict:
        return a.model_dump(exclude={"description"})

    out = []
    for arm, a in arms.items():
        if arm == baseline or baseline not in arms or delta(a) != delta(arms[baseline]):
            continue
        for lk in an.load_keys:
            e = an.effects.get((arm, lk, data_metric))
            if e is not None and math.isfinite(e.ci_low):
                half = max(abs(e.pct(e.ci_low)), abs(e.pct(e.ci_high)))
                out.append(
                    f"A/A arm {arm} (identical to {baseline}) at {lk}: {e.text()}; this is the "
                    f"machine's own noise, a noise band of about +-{half:.1f}% fits it"
                )
    return out


def per_request(
    data: Evidence, store: Store, fields: tuple[str, ...]
) -> dict[str, dict[tuple[str, str], list[float]]]:
    """Per-request values of each of `fields` pooled over the ok runs of each arm x load point
    (one read of the stored requests for all fields)."""
    out: dict[str, dict[tuple[str, str], list[float]]] = {f: {} for f in fields}
    for r in data.runs:
        lp = data.load_points.get(r.load_point_id) if r.load_point_id else None
        if r.status != "ok" or lp is None:
            continue
        vals = {f: out[f].setdefault((r.arm, r.load_key), []) for f in fields}
        f_req = store.requests_file(lp)
        if f_req is not None and not f_req.exists():
            continue                            # said among the warnings (collect)
        got: dict[str, list[float]] = {f: [] for f in fields}
        try:
            for rec in store.requests(lp):
                for f in fields:
                    v = rec.get(f)
                    if isinstance(v, int | float) and math.isfinite(v):
                        got[f].append(float(v))
        except UserError as exc:                # a damaged file: left out, and said
            data.analysis.warnings.append(f"{exc}: the distribution plots leave that run out")
            continue
        for f in fields:
            vals[f] += got[f]
    return out
