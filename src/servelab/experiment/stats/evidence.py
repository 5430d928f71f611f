"""Which stored runs count, and under which rule: the one place the runner (deciding whether to
stop) and the report (showing what was decided) read an experiment's evidence from, so that
both always agree.

A block is *flagged* when one of its runs crossed an interference threshold while measured (the
reason is in the run's provenance). With `noise.on_interference = "repeat"` the first
`max_repeats` flagged blocks are *excluded* from the statistics and replaced by extra blocks;
they stay stored, and the report lists them with the reason: nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servelab.experiment.design.model import ExperimentSpec, NoiseSpec
from servelab.experiment.design.parse import from_store
from servelab.experiment.stats import sequential as seq
from servelab.experiment.stats.analysis import Analysis, analyze
from servelab.experiment.stats.runs import RunValue
from servelab.store import LoadPointRow, RunRow, Store


def design_of(spec: ExperimentSpec) -> seq.Design | None:
    """The stopping rule of a spec (None for fixed repetitions)."""
    if not spec.adaptive_on:
        return None
    a = spec.adaptive
    loads = [k for k, _, _ in spec.load.keys()]
    primary = [k for k in loads if a.primary is None or k in a.primary]
    return seq.Design(
        a.min,
        a.max,
        a.alpha,
        (len(spec.arms) - 1) * len(primary),
        a.boundary,
        None if a.primary is None else tuple(primary),
    )


def flagged_blocks(runs: Sequence[RunRow], lps: dict[int, LoadPointRow]) -> dict[int, str]:
    """block -> the first threshold one of its runs crossed (from the runs' provenance)."""
    out: dict[int, str] = {}
    for r in runs:
        lp = lps.get(r.load_point_id) if r.load_point_id else None
        why = ((lp.provenance.get("interference") or {}) if lp else {}).get("flagged")
        if why and r.block is not None and r.block not in out:
            out[r.block] = f"arm {r.arm} at {r.load_key}: {why}"
    return out


def excluded_blocks(flagged: dict[int, str], noise: NoiseSpec) -> list[int]:
    """The flagged blocks that were repeated (left out of the statistics), in block order."""
    if noise.on_interference != "repeat":
        return []
    return sorted(flagged)[: noise.max_repeats]


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything stored about one experiment and its statistics: what the runner decides with
    and what the report states (report/ reads it, never recomputes it)."""

    name: str
    spec: ExperimentSpec  # the stored spec as the typed model (its defaults in one place)
    stored: dict[str, Any]  # the spec exactly as stored (the report shows it as stored)
    runs: list[RunRow]
    load_points: dict[int, LoadPointRow]
    analysis: Analysis
    flagged: dict[int, str]  # block -> reason
    excluded: list[int]  # blocks left out (repeated)
    blocks_used: int  # distinct blocks with an ok run that count

    @property
    def primary(self) -> str:
        return self.spec.primary_metric


def gather(
    store: Store, name: str, noise_band: float | None = None, metrics: Sequence[str] | None = None
) -> Evidence:
    """Everything stored about an experiment and its statistics (`metrics`: all by default)."""
    stored = store.experiment(name)
    spec = from_store(stored)
    runs = store.runs(name)
    lps = {r.load_point_id: store.load_point(r.load_point_id) for r in runs if r.load_point_id}
    flagged = flagged_blocks(runs, lps)
    excluded = excluded_blocks(flagged, spec.noise)
    ok = [
        r
        for r in runs
        if r.status == "ok" and r.load_point_id in lps and r.block not in set(excluded)
    ]
    values = [
        RunValue(r.arm, r.load_key, r.repetition, r.block, lps[r.load_point_id].summary) for r in ok
    ]
    band = spec.noise_band if noise_band is None else noise_band
    kw: dict[str, Any] = {"metrics": tuple(metrics)} if metrics is not None else {}
    an = analyze(
        values,
        baseline=spec.baseline_arm,
        arms=spec.arm_order,
        load_keys=[key for key, _, _ in spec.load.keys()],
        noise_band=band,
        design=design_of(spec),
        **kw,
    )
    used = len({r.block for r in ok if r.block is not None})
    return Evidence(name, spec, stored, runs, lps, an, flagged, excluded, used)
