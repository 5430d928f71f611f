"""One trace -> one report (a plain dict: what `--json` writes and `html.py` renders).

Phases first (issue 32): every figure (busy/idle, categories, top kernels, what-if, the bound)
is computed per phase over its steady-state steps (warm-up steps named and kept out, see
phases.py), and the headline speaks of the phase that sets the metric asked about (headline.py).
The top-level figures are the secondary, wall-weighted view over all steps (warm-up included,
as before), except the top-level what-if, which is computed over the steady-state steps.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from servelab.profile import headline as hl
from servelab.profile.breakdown import Breakdown, Rules, breakdown, diff, load_rules, short_name
from servelab.profile.phases import Warmup, role_of, screen, split
from servelab.profile.steps import Step, StepSet, busy_by_device, find_steps
from servelab.profile.trace import Trace, launch_times, read_trace
from servelab.profile.whatif import WhatIf, apply_whatifs, parse_whatif, rank_categories

TOP_KERNELS = 20


def _nan_to_none(x: float) -> float | None:
    return None if isinstance(x, float) and (math.isnan(x) or math.isinf(x)) else x


def _graphs(trace: Trace, steps: StepSet, bd: Breakdown) -> dict[str, Any]:
    launches = launch_times(trace)
    in_steps = [i for st in steps.steps for i in st.activities]
    graph_idx = [i for i in in_steps if launches.get(trace.corr[i], (0.0, False))[1]]
    per_launch: dict[int, list[int]] = {}
    for i in graph_idx:
        per_launch.setdefault(trace.corr[i], []).append(i)
    n_launch = len(per_launch)
    t_graph = sum(trace.dur_us[i] for i in graph_idx)
    spans = [max(trace.ts_us[i] + trace.dur_us[i] for i in idx) - min(trace.ts_us[i] for i in idx)
             for idx in per_launch.values()]
    busy = [max(busy_by_device(trace, idx).values()) for idx in per_launch.values()]
    return {
        "graph_launches": n_launch,
        "kernels_in_graphs": len(graph_idx),
        "kernels_per_launch": len(graph_idx) / n_launch if n_launch else None,
        # inside one replay: first kernel start to last kernel end, and the busy part of it
        "mean_launch_span_us": sum(spans) / n_launch if n_launch else None,
        "mean_launch_busy_us": sum(busy) / n_launch if n_launch else None,
        "share_of_kernel_time": (
            t_graph / bd.kernel_total_us if bd.kernel_total_us > 0 and n_launch else None
        ),
    }


def _step_row(st: Step, warm: dict[int, Warmup]) -> dict[str, Any]:
    return {
        "index": st.index,
        "name": st.name,
        "phase": st.phase,
        "batch_size": st.batch_size,
        "start_us": st.start_us,
        "host_start_us": st.host_start_us,
        "wall_us": st.wall_us,
        "gpu_busy_us": st.gpu_busy_us,
        "gpu_busy_us_by_device": {str(d): b for d, b in st.busy_us.items()},
        "gpu_busy_fraction": _nan_to_none(1.0 - st.idle_fraction),
        "idle_fraction": _nan_to_none(st.idle_fraction),
        "n_activities": len(st.activities),
        "n_graph_launches": st.n_graph_launches,
        "n_graph_activities": st.n_graph_activities,
        "warmup": warm[st.index].reason if st.index in warm else None,
    }


def _what_if(trace: Trace, ss: StepSet, bd: Breakdown, parsed: list[WhatIf],
             host_bound: bool) -> dict[str, Any]:
    res = apply_whatifs(trace, ss, bd, parsed)
    unmatched = [spec for spec, n in res.matched.items() if n == 0]
    note = ("host gaps kept as measured; on a host-bound trace the real gain is smaller"
            if host_bound else "host gaps kept as measured")
    ahead = sum(st.host_ran_ahead for st in ss.steps)
    if ahead:
        note += (f"; the host ran ahead of the GPU in {ahead} of {len(ss.steps)} steps: its work "
                 "hidden under kernel time becomes the floor once kernels get faster")
    if unmatched:
        note += f"; {', '.join(unmatched)} matched no GPU activity in the steps"
    n = max(len(ss.steps), 1)
    return {
        "specs": res.specs,
        "wall_us": res.wall_us,
        "new_wall_us": res.new_wall_us,
        "speedup": _nan_to_none(res.speedup),
        "gpu_busy_us": res.busy_us,
        "new_gpu_busy_us": res.new_busy_us,
        "per_step_us": res.wall_us / n,
        "new_per_step_us": res.new_wall_us / n,
        "matched_activities": res.matched,
        "note": note,
    }


def block(trace: Trace, ss: StepSet, rules: Rules, parsed: list[WhatIf]) -> dict[str, Any]:
    """Busy/idle, categories, ranking, kernels and what-if over the steps of `ss`."""
    bd = breakdown(trace, ss, rules)
    gains = {g.category: g for g in rank_categories(trace, ss, bd)}
    walls = sorted(st.wall_us for st in ss.steps)
    wall = sum(walls)
    busy = sum(st.gpu_busy_us for st in ss.steps)
    idle = 1.0 - busy / wall if wall > 0 else float("nan")
    bsz: dict[int, int] = {}
    for st in ss.steps:
        if st.batch_size is not None:
            bsz[st.batch_size] = bsz.get(st.batch_size, 0) + 1
    out: dict[str, Any] = {
        "n_steps": len(ss.steps),
        "wall_us": wall,
        "gpu_busy_us": busy,
        "mean_step_us": wall / len(walls) if walls else None,
        "median_step_us": statistics.median(walls) if walls else None,
        "min_step_us": walls[0] if walls else None,
        "max_step_us": walls[-1] if walls else None,
        "gpu_busy_fraction": _nan_to_none(1.0 - idle),
        "idle_fraction": _nan_to_none(idle),
        "host_bound": hl.host_bound(idle) if idle == idle else None,  # no steps: unknown
        "batch_sizes": dict(sorted(bsz.items())),
        "kernel_total_us": bd.kernel_total_us,
        "categories": [
            asdict(r) | {"exclusive_us": gains[r.category].exclusive_us,
                         "max_speedup_if_free": _nan_to_none(gains[r.category].max_speedup)}
            for r in bd.categories
        ],
        "ranking": [{"category": g.category, "max_speedup_if_free": _nan_to_none(g.max_speedup)}
                    for g in gains.values()],
        "top_kernels": [asdict(k) for k in bd.kernels[:TOP_KERNELS]],
        "what_if": None,
        "_breakdown": bd,
    }
    if parsed and ss.steps:
        out["what_if"] = _what_if(trace, ss, bd, parsed, out["host_bound"])
    return out


def _phase_blocks(trace: Trace, steps: StepSet, warm: list[Warmup], how: dict[str, str],
                  rules: Rules, parsed: list[WhatIf]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, (steady, cold) in split(steps, warm).items():
        blk = block(trace, StepSet(steady, steps.source, ()), rules, parsed)
        blk["role"] = role_of(name)
        blk["n_warmup"] = len(cold)
        blk["screening"] = how[name]
        blk["verdict"] = (hl.phase_verdict(blk) if steady else
                          f"all {len(cold)} steps are warm-up; no steady-state figures")
        out[name] = blk
    return out


def analyze(
    path: str | Path,
    step_regex: str | None = None,
    rules: Rules | None = None,
    whatifs: list[str] | None = None,
    metric: str = "tpot",
    mix: tuple[dict[str, float], str] | None = None,
) -> dict[str, Any]:
    """Read a trace and build its report: phases first (steady state), then all steps.

    `metric` ("tpot" or "ttft") picks the phase the headline speaks of; `mix` (shares of serving
    time per phase or role, and where they came from) adds the workload-weighted bound."""
    rules = rules or load_rules()
    trace = read_trace(path, step_regex=step_regex)
    steps = find_steps(trace, step_regex)
    warm, how = screen(trace, steps)
    cold = {w.index: w for w in warm}
    steady = StepSet([st for st in steps.steps if st.index not in cold], steps.source, ())
    allb = block(trace, StepSet(steps.steps, steps.source, ()), rules, [])
    names = [k.name for k in allb["_breakdown"].kernels]
    parsed = [parse_whatif(s, rules.categories, names) for s in whatifs or []]
    if parsed:  # never divided by a window that a compile fills: warm-up steps stay out
        allb["what_if"] = _what_if(trace, steady, allb["_breakdown"], parsed, allb["host_bound"])
        if warm:
            allb["what_if"]["note"] += f"; over the {len(steady.steps)} steady-state steps " \
                                       f"({len(warm)} warm-up step(s) excluded)"
    phases = _phase_blocks(trace, steps, warm, how, rules, parsed)
    first, focus = hl.headline(phases, metric, len(warm), [w.reason for w in warm])
    outside_t = sum(trace.dur_us[i] for i in steps.outside_activities)
    report: dict[str, Any] = {
        "trace": str(path),
        "n_events": trace.n_events,
        "n_gpu_activities": trace.n_gpu,
        "steps_from": steps.source,
        "n_steps": len(steps.steps),
        "n_warmup": len(warm),
        "metric": metric,
        "focus_phase": focus,
        "verdict": first,
        "all_steps": hl.all_steps_line(allb, len(warm)),
        "warmup_steps": [asdict(w) for w in warm],
        "phases": {k: {x: v for x, v in p.items() if x != "_breakdown"} for k, p in phases.items()},
        "outside_steps": {"n_activities": len(steps.outside_activities), "time_us": outside_t},
        "cuda_graphs": _graphs(trace, steps, allb["_breakdown"]),
        "steps": [_step_row(st, cold) for st in steps.steps],
        "mix_bound": None,
    }
    report |= {k: v for k, v in allb.items() if k not in ("n_steps", "batch_sizes")}
    report["n_steady_steps"] = len(steady.steps)
    if mix is not None:
        report["mix_bound"] = hl.weighted_bound(mix[0], phases, mix[1])
    report["_phase_breakdowns"] = {k: p["_breakdown"] for k, p in phases.items()}
    return report


def _diff(a_bd: Breakdown, b_bd: Breakdown, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    cats, kernels = diff(a_bd, b_bd)
    row = lambda r: {  # noqa: E731
        "key": r.key,
        "a_per_step_us": r.a_per_step_us,
        "b_per_step_us": r.b_per_step_us,
        "delta_us": r.delta_us,
        "ratio": _nan_to_none(r.ratio),
    }
    a_step = a["wall_us"] / max(a["n_steps"], 1)
    b_step = b["wall_us"] / max(b["n_steps"], 1)
    return {
        "a_step_us": a_step,
        "b_step_us": b_step,
        "step_ratio": _nan_to_none(b_step / a_step) if a_step > 0 else None,
        "a_gpu_busy_fraction": a["gpu_busy_fraction"],
        "b_gpu_busy_fraction": b["gpu_busy_fraction"],
        "categories": [row(r) for r in cats],
        "kernels": [row(r) | {"short": short_name(r.key)} for r in kernels],
    }


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """`--vs`: per phase (the phases both traces hold, steady state), then over all steps: step
    time, busy fraction, time per category and top kernels, A vs B."""
    out = {"a": a["trace"], "b": b["trace"]}
    out |= _diff(a["_breakdown"], b["_breakdown"], a, b)
    pa, pb = a["_phase_breakdowns"], b["_phase_breakdowns"]
    out["phases"] = {
        name: _diff(pa[name], pb[name], a["phases"][name], b["phases"][name])
        for name in a["phases"]
        if name in b["phases"] and a["phases"][name]["n_steps"] and b["phases"][name]["n_steps"]
    }
    out["phases_only_in_a"] = sorted(set(a["phases"]) - set(b["phases"]))
    out["phases_only_in_b"] = sorted(set(b["phases"]) - set(a["phases"]))
    return out


def public(report: dict[str, Any]) -> dict[str, Any]:
    """The report without in-memory helpers (what JSON gets)."""
    return {k: v for k, v in report.items() if not k.startswith("_")}
