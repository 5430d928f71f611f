"""What the report says about the machine: the stopping rule's outcome, the blocks the machine
disturbed (paused, repeated or kept), and per run the interference and the cores it ran on.
Kept apart from the tables so that the report's layout and the noise story stay readable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from servelab.experiment.design.model import ExperimentSpec
from servelab.experiment.stats import sequential as seq
from servelab.experiment.stats.analysis import undecided
from servelab.experiment.stats.evidence import Evidence, design_of


def stopping_lines(data: Evidence) -> list[str]:
    """The stopping rule and what it decided (adaptive repetitions), and every block the
    machine disturbed: paused before, repeated (left out of the statistics) or kept."""
    an, out = data.analysis, []
    if an.design is not None:
        d = an.design
        und = undecided(an, data.primary)
        secondary = d.secondary_keys(an.load_keys)
        out.append(
            f"adaptive repetitions: {data.blocks_used} blocks used (min {d.min_n}, max "
            f"{d.max_n}); rule: {seq.rule_text(d)}; familywise alpha {d.alpha:g} over "
            f"{d.effects} primary effect{'s' if d.effects != 1 else ''} (each look at "
            f"{d.levels_text()})"
            + (
                "; secondary (an interval at alpha on its own, no verdict, not waited for): "
                + ", ".join(secondary)
                if secondary
                else ""
            )
        )
        out.append(measured_rate_line(data.spec))
        out.append(
            "every primary effect decided"
            if not und
            else "left undecided (budget or maximum reached): "
            + ", ".join(f"{a} at {lk}" for a, lk in und)
        )
    else:
        out.append(
            f"rule: fixed repetitions ({data.spec.repetitions}), expanded-bootstrap 95% "
            "CI (paired by block when the schedule pairs runs) against the noise band"
        )
        out.append(measured_rate_line(data.spec))
    for b, why in sorted(data.flagged.items()):
        fate = (
            "repeated: left out of the statistics, stored and listed below"
            if b in data.excluded
            else "kept in the statistics"
        )
        out.append(f"interference in block {b + 1} ({why}): {fate}")
    for r in data.runs:
        lp = data.load_points.get(r.load_point_id) if r.load_point_id else None
        inter = (lp.provenance.get("interference") or {}) if lp else {}
        if inter.get("paused_s"):
            out.append(
                f"paused {inter['paused_s']:.0f} s before block {(r.block or 0) + 1} "
                f"({inter.get('pause_reason') or 'the machine was busy'})"
            )
    return out


def interference_cells(
    prov: dict[str, Any], block: int | None, excluded: list[int]
) -> dict[str, str]:
    """The machine beside the run: other processes' CPU, steal, load, the cores it ran on."""
    inter = prov.get("interference") or {}
    pins = prov.get("pinning") or {}

    def fmt(x: Any, pct: bool = False) -> str:
        if not isinstance(x, int | float):
            return "n/a"
        return f"{x * 100:.1f}%" if pct else f"{x:.2f}"

    client, engine = pins.get("client_actual"), pins.get("engine_actual")
    cores = (
        f"{_cores(client)} / {_cores(engine)}" if pins.get("client") is not None else "not pinned"
    )
    flagged = inter.get("flagged") or ""
    if flagged and block in excluded:
        flagged += " (block repeated, left out)"
    gpu = inter.get("gpu") or []
    if gpu:
        flagged += "; GPU " + ", ".join(
            f"{g.get('index')}: {g.get('sm_clock_mhz')} MHz {g.get('temperature_c')} C"
            + (f" foreign pids {g['foreign_pids']}" if g.get("foreign_pids") else "")
            for g in gpu
        )
    return {
        "other_cpu": fmt(inter.get("other_cpu_cores")),
        "steal": fmt(inter.get("steal_frac"), pct=True),
        "load1": fmt(inter.get("load1_end")),
        "cores": cores if pins else "n/a",
        "flagged": flagged,
    }


def _cores(c: list[int] | None) -> str:
    return ",".join(map(str, c)) if c else "?"


RATES_FILE = Path(__file__).with_name("error_rates.json")


def rule_name(d: Any) -> str:
    """A sequential design's key in error_rates.json (bench_noise_sim.py uses this too)."""
    shape = "" if d.shape == "pocock" else f", {d.shape}"
    return f"adaptive {d.min_n}-{d.max_n}, {d.effects} effect(s), alpha {d.alpha:g}{shape}"


def rule_key(spec: ExperimentSpec) -> str | None:
    """The key of this experiment's rule in error_rates.json (as bench_noise_sim.py names it)."""
    d = design_of(spec)
    return rule_name(d) if d is not None else f"fixed {spec.repetitions}"


def measured_rate_line(spec: ExperimentSpec) -> str:
    """The rule's simulated error rate under realistic noise, or where to find how to get it."""
    key = rule_key(spec)
    try:
        data = orjson.loads(RATES_FILE.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return "measured error rate: not recorded (run benchmarks/bench_noise_sim.py --record)"
    rule = data.get("rules", {}).get(key)
    if rule is None:
        return (
            f"measured error rate: this design ({key}) was not simulated; "
            f"benchmarks/bench_noise_sim.py measures the ones in docs/EXPERIMENTS.md"
        )
    parts = []
    for noise, cells in rule.items():
        aa = cells.get("aa") or {}
        parts.append(
            f"{noise} machine: wrong verdict {aa.get('wrong_verdict', float('nan')) * 100:.1f}%, "
            f"interval missed the truth {aa.get('missed_truth', float('nan')) * 100:.1f}%"
        )
    sim_band, band = float(data.get("band", 0.0)), float(spec.noise_band)
    note = (
        f" (simulated with a {sim_band * 100:g}% band, this experiment's is {band * 100:g}%: the "
        "interval's error does not depend on it; a wider band only lowers wrong verdicts)"
        if abs(sim_band - band) > 1e-12
        else ""
    )
    return (
        f"measured error rate of this rule ({key}) over {data.get('experiments_per_cell')} "
        f"simulated A/A experiments per noise model ({data.get('date_utc')}): "
        + "; ".join(parts)
        + note
    )
