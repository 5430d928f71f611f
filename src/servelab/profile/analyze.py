"""One trace -> one report (a plain dict: what `--json` writes and `html.py` renders).

Order of the verdict follows the story's lesson: when the GPU idles most of a step, the step is
host-bound and kernel work is not the target; say that before any kernel table.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from servelab.profile.breakdown import Breakdown, Rules, breakdown, diff, load_rules, short_name
from servelab.profile.steps import StepSet, busy_by_device, find_steps
from servelab.profile.trace import Trace, launch_times, read_trace
from servelab.profile.whatif import apply_whatifs, parse_whatif, rank_categories

HOST_BOUND_IDLE = 0.5  # idle fraction above which a step is called host-bound
TOP_KERNELS = 20


def _nan_to_none(x: float) -> float | None:
    return None if isinstance(x, float) and (math.isnan(x) or math.isinf(x)) else x


def _verdict(idle_fraction: float, top: str | None, top_share: float | None) -> tuple[bool, str]:
    pct = 100.0 * idle_fraction
    if idle_fraction >= HOST_BOUND_IDLE:
        return True, (
            f"HOST-BOUND: the GPU is idle {pct:.0f}% of the step time. Kernel work is not the "
            "target: look at launch overhead (CUDA graphs), host scheduling, synchronizations "
            "and Python in the step first."
        )
    msg = f"GPU-bound: the GPU is busy {100 - pct:.0f}% of the step time"
    if top is not None and top_share is not None:
        msg += f"; the largest category is {top} ({100 * top_share:.0f}% of kernel time)"
    if idle_fraction >= 0.2:
        msg += f". Host gaps still take {pct:.0f}%: kernel speedups are capped by them"
    return False, msg + "."


def _phases(steps: StepSet) -> dict[str, dict[str, Any]]:
    """Steps grouped by SGLang phase (EXTEND, DECODE, ...): a few long prefill steps can make a
    whole trace look host-bound while its decode steps keep the GPU busy (seen on the engine)."""
    out: dict[str, dict[str, Any]] = {}
    for st in steps.steps:
        if st.phase is None:
            continue
        row = out.setdefault(st.phase, {"n_steps": 0, "wall_us": 0.0, "gpu_busy_us": 0.0})
        row["n_steps"] += 1
        row["wall_us"] += st.wall_us
        row["gpu_busy_us"] += st.gpu_busy_us
    for row in out.values():
        busy = row["gpu_busy_us"] / row["wall_us"] if row["wall_us"] > 0 else float("nan")
        row["mean_step_us"] = row["wall_us"] / row["n_steps"]
        row["gpu_busy_fraction"] = _nan_to_none(busy)
        row["host_bound"] = bool(1.0 - busy >= HOST_BOUND_IDLE) if busy == busy else None
    return out


def _phase_note(phases: dict[str, dict[str, Any]]) -> str:
    """One sentence when the phases disagree on host-bound (else nothing)."""
    if len({p["host_bound"] for p in phases.values()}) < 2:
        return ""
    parts = [
        f"{name} steps ({p['n_steps']}, mean {p['mean_step_us']:,.0f} us) GPU busy "
        f"{100 * (p['gpu_busy_fraction'] or 0):.0f}% ({'host' if p['host_bound'] else 'GPU'}-bound)"
        for name, p in sorted(phases.items(), key=lambda kv: -kv[1]["n_steps"])
    ]
    return " By phase: " + "; ".join(parts) + "."


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


def analyze(
    path: str | Path,
    step_regex: str | None = None,
    rules: Rules | None = None,
    whatifs: list[str] | None = None,
) -> dict[str, Any]:
    """Read a trace and build its report: steps, busy/idle, categories, kernels, what-ifs."""
    rules = rules or load_rules()
    trace = read_trace(path, step_regex=step_regex)
    steps = find_steps(trace, step_regex)
    bd = breakdown(trace, steps, rules)
    gains = {g.category: g for g in rank_categories(trace, steps, bd)}
    wall = sum(st.wall_us for st in steps.steps)
    busy = sum(st.gpu_busy_us for st in steps.steps)
    idle_frac = 1.0 - busy / wall if wall > 0 else float("nan")
    top = bd.categories[0] if bd.categories else None
    host_bound, verdict = _verdict(idle_frac, top.category if top else None, top.share if top else None)
    phases = _phases(steps)
    verdict += _phase_note(phases)
    outside_t = sum(trace.dur_us[i] for i in steps.outside_activities)
    report: dict[str, Any] = {
        "trace": str(path),
        "n_events": trace.n_events,
        "n_gpu_activities": trace.n_gpu,
        "steps_from": steps.source,
        "n_steps": len(steps.steps),
        "wall_us": wall,
        "gpu_busy_us": busy,
        "gpu_busy_fraction": _nan_to_none(1.0 - idle_frac),
        "idle_fraction": _nan_to_none(idle_frac),
        "host_bound": host_bound,
        "verdict": verdict,
        "phases": phases,
        "outside_steps": {"n_activities": len(steps.outside_activities), "time_us": outside_t},
        "cuda_graphs": _graphs(trace, steps, bd),
        "kernel_total_us": bd.kernel_total_us,
        "steps": [
            {
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
            }
            for st in steps.steps
        ],
        "categories": [
            asdict(r)
            | {
                "exclusive_us": gains[r.category].exclusive_us,
                "max_speedup_if_free": _nan_to_none(gains[r.category].max_speedup),
            }
            for r in bd.categories
        ],
        "ranking": [
            {"category": g.category, "max_speedup_if_free": _nan_to_none(g.max_speedup)}
            for g in gains.values()
        ],
        "top_kernels": [asdict(k) for k in bd.kernels[:TOP_KERNELS]],
        "what_if": None,
    }
    if whatifs:
        cats = rules.categories
        names = [k.name for k in bd.kernels]
        parsed = [parse_whatif(s, cats, names) for s in whatifs]
        res = apply_whatifs(trace, steps, bd, parsed)
        unmatched = [spec for spec, n in res.matched.items() if n == 0]
        note = (
            "host gaps kept as measured; on a host-bound trace the real gain is smaller"
            if host_bound
            else "host gaps kept as measured"
        )
        ahead = sum(st.host_ran_ahead for st in steps.steps)
        if ahead:
            note += (
                f"; the host ran ahead of the GPU in {ahead} of {len(steps.steps)} steps: its work "
                "hidden under kernel time becomes the floor once kernels get faster"
            )
        if unmatched:
            note += f"; {', '.join(unmatched)} matched no GPU activity in the steps"
        report["what_if"] = {
            "specs": res.specs,
            "wall_us": res.wall_us,
            "new_wall_us": res.new_wall_us,
            "speedup": _nan_to_none(res.speedup),
            "gpu_busy_us": res.busy_us,
            "new_gpu_busy_us": res.new_busy_us,
            "per_step_us": res.wall_us / max(len(steps.steps), 1),
            "new_per_step_us": res.new_wall_us / max(len(steps.steps), 1),
            "matched_activities": res.matched,
            "note": note,
        }
    report["_breakdown"] = bd  # for --vs; dropped before JSON
    return report


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """`--vs`: per-step time per category and top kernels, A vs B."""
    cats, kernels = diff(a["_breakdown"], b["_breakdown"])
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
        "a": a["trace"],
        "b": b["trace"],
        "a_step_us": a_step,
        "b_step_us": b_step,
        "step_ratio": _nan_to_none(b_step / a_step) if a_step > 0 else None,
        "a_gpu_busy_fraction": a["gpu_busy_fraction"],
        "b_gpu_busy_fraction": b["gpu_busy_fraction"],
        "categories": [row(r) for r in cats],
        "kernels": [row(r) | {"short": short_name(r.key)} for r in kernels],
    }


def public(report: dict[str, Any]) -> dict[str, Any]:
    """The report without in-memory helpers (what JSON gets)."""
    return {k: v for k, v in report.items() if not k.startswith("_")}
