"""What the report says first, per phase, and the workload-weighted bound.

The headline speaks of the phase that sets the serving metric the user asked about (TPOT:
decode steps, or verify + draft with MTP; TTFT: prefill steps), then gives every other phase's
verdict: GPU-bound with its target (the largest kernel category and the most making it free
could give) or host-bound (kernel work is not the target). A wall-weighted line over all steps
comes second: a couple of long prefill steps can make a whole window "host-bound" while the
decode steps that set TPOT keep the GPU busy (issue 32: "GPU idle 56%" on a window whose decode
steps were 68% busy and attention-bound).

Workload-weighted bound: with shares `w_p` of serving time per phase (`--mix decode=0.9,
extend=0.1`, or from a load point: TTFT vs (tokens - 1) x TPOT per request) and each phase's
speedup `s_p` under a what-if, the workload speeds up `1 / sum_p (w_p / s_p)` (Amdahl over the
phases). A share whose phase the trace lacks is counted as unchanged (`s = 1`), and said.
"""

from __future__ import annotations

import math
from typing import Any

from servelab.errors import UserError
from servelab.profile.phases import METRIC_ROLES, ROLES

HOST_BOUND_IDLE = 0.5  # idle fraction above which a step is called host-bound
HOST_GAP_NOTE = 0.2  # idle fraction above which a GPU-bound verdict warns of host gaps


def host_bound(idle_fraction: float) -> bool:
    return idle_fraction >= HOST_BOUND_IDLE


def _top(block: dict[str, Any]) -> dict[str, Any] | None:
    return block["categories"][0] if block["categories"] else None


def plain_verdict(block: dict[str, Any]) -> str:
    """The verdict of steps without engine phase names (ProfilerStep#N traces)."""
    idle = block["idle_fraction"]
    pct = 100.0 * (idle if idle is not None else float("nan"))
    if block["host_bound"]:
        return (f"HOST-BOUND: the GPU is idle {pct:.0f}% of the step time. Kernel work is not the "
                "target: look at launch overhead (CUDA graphs), host scheduling, synchronizations "
                "and Python in the step first.")
    msg = f"GPU-bound: the GPU is busy {100 - pct:.0f}% of the step time"
    top = _top(block)
    if top is not None:
        msg += f"; the largest category is {top['category']} ({100 * top['share']:.0f}% of kernel time)"
    if idle is not None and idle >= HOST_GAP_NOTE:
        msg += f". Host gaps still take {pct:.0f}%: kernel speedups are capped by them"
    return msg + "."


def phase_verdict(block: dict[str, Any]) -> str:
    """`GPU-bound, busy 68%; target attention (38% of kernel time, at most 1.35x if free)`."""
    idle = block["idle_fraction"]
    if idle is None:
        return "no GPU time measured"
    if block["host_bound"]:
        return (f"HOST-BOUND, the GPU idle {100 * idle:.0f}% of the step: the target is host work "
                "(launch overhead, CUDA graphs, scheduling, syncs), not kernels")
    msg = f"GPU-bound, the GPU busy {100 * (1 - idle):.0f}% of the step"
    top = _top(block)
    if top is not None:
        bound = top["max_speedup_if_free"]
        most = "no bound if free" if bound is None else f"at most {bound:.2f}x if free"
        msg += f"; target {top['category']} ({100 * top['share']:.0f}% of kernel time, {most})"
    if idle >= HOST_GAP_NOTE:
        msg += f"; host gaps take {100 * idle:.0f}% and cap kernel gains"
    return msg


def _describe(name: str, p: dict[str, Any]) -> str:
    bs = p.get("batch_sizes") or {}
    bs_txt = f", bs {'/'.join(str(b) for b in bs)}" if bs else ""
    return (f"{name} ({p['n_steps']} steps{bs_txt}, median {p['median_step_us']:,.0f} us): "
            f"{p['verdict']}")


def focus_phase(phases: dict[str, dict[str, Any]], metric: str) -> str | None:
    """The phase with the most steady-state time among those that set `metric`."""
    roles = METRIC_ROLES[metric]
    cands = [(p["wall_us"], name) for name, p in phases.items()
             if p["role"] in roles and p["n_steps"] > 0]
    return max(cands)[1] if cands else None


def headline(phases: dict[str, dict[str, Any]], metric: str, n_warmup: int,
             reasons: list[str]) -> tuple[str, str | None]:
    """(first line, the phase it speaks of)."""
    if set(phases) <= {"STEP"}:
        p = phases.get("STEP")
        text = plain_verdict(p) if p and p["n_steps"] else "every step is warm-up"
        focus = "STEP" if p else None
    else:
        focus = focus_phase(phases, metric)
        label = metric.upper()
        if focus is None:
            roles = "/".join(METRIC_ROLES[metric])
            text = f"No {roles} steps in this trace: {label} cannot be read from it."
        else:
            text = f"{label} is set by {_describe(focus, phases[focus])}."
        others = [_describe(n, p) for n, p in phases.items() if n != focus and p["n_steps"]]
        if others:
            text += (" Also " if focus else " Its phases: ") + "; ".join(others) + "."
    if n_warmup:
        kinds = sorted({r.split(" (")[0].split(";")[0] for r in reasons})
        text += (f" {n_warmup} warm-up step(s) kept out of these figures ({'; '.join(kinds)}).")
    return text, focus


def all_steps_line(block: dict[str, Any], n_warmup: int) -> str:
    """The secondary, wall-weighted line over every step of every phase, warm-up included."""
    busy = block["gpu_busy_fraction"]
    n = block["n_steps"]
    return (f"all {n} steps (wall-weighted, phases mixed"
            + (f", {n_warmup} warm-up included" if n_warmup else "") + "): GPU busy "
            + ("n/a" if busy is None else f"{100 * busy:.0f}%")
            + (f", mean step {block['mean_step_us']:,.0f} us" if block["mean_step_us"] else "")
            + (f", largest category {_top(block)['category']}" if _top(block) else ""))


def mix_from_load_point(summary: dict[str, Any], lp_id: int) -> dict[str, float]:
    """Shares of a request's latency: TTFT (prefill) vs (output tokens - 1) x TPOT (decode)."""
    ttft = (summary.get("ttft_ms") or {}).get("mean")
    tpot = (summary.get("tpot_ms") or {}).get("mean")
    done, out = summary.get("completed"), summary.get("total_output_tokens")
    if ttft is None or tpot is None or not done or out is None:
        raise UserError(f"load point {lp_id} has no TTFT/TPOT/token counts to weigh phases with")
    decode = (out / done - 1.0) * tpot
    total = ttft + decode
    if total <= 0:
        raise UserError(f"load point {lp_id}: TTFT + decode time is 0; nothing to weigh")
    return {"PREFILL": ttft / total, "DECODE": decode / total}


def _resolve(name: str, phases: dict[str, dict[str, Any]]) -> list[str]:
    if name in phases:
        return [name]
    role = ROLES.get(name, name.lower())
    return [n for n, p in phases.items() if p["role"] == role and p["n_steps"]]


def weighted_bound(mix: dict[str, float], phases: dict[str, dict[str, Any]],
                   source: str) -> dict[str, Any]:
    """Amdahl over phases: per category made free, and for the --what-if specs."""
    share: dict[str, float] = {}
    notes: list[str] = []
    unchanged = 0.0
    for name, w in mix.items():
        hits = _resolve(name, phases)
        if not hits:
            unchanged += w
            notes.append(f"{name} ({100 * w:.0f}%) is not in this trace: counted as unchanged")
            continue
        wall = sum(phases[h]["wall_us"] for h in hits)
        for h in hits:
            share[h] = share.get(h, 0.0) + w * (phases[h]["wall_us"] / wall if wall else 1 / len(hits))

    def combine(speedup: dict[str, float | None]) -> float | None:
        t = unchanged
        for h, w in share.items():
            s = speedup.get(h)
            s = 1.0 if s is None else s
            t += 0.0 if math.isinf(s) else w / s
        return None if t <= 0 else 1.0 / t

    cats = sorted({c["category"] for h in share for c in phases[h]["categories"]})
    bounds = []
    for c in cats:
        per = {h: next((x["max_speedup_if_free"] for x in phases[h]["categories"]
                        if x["category"] == c), 1.0) for h in share}
        per = {h: (math.inf if v is None else v) for h, v in per.items()}
        bounds.append({"category": c, "speedup_if_free": combine(per),
                       "per_phase": {h: (None if math.isinf(v) else v) for h, v in per.items()}})
    bounds.sort(key=lambda b: -(b["speedup_if_free"] or math.inf))
    out: dict[str, Any] = {"source": source, "mix": mix, "phase_shares": share,
                           "bounds": bounds, "notes": notes, "what_if": None}
    wi = {h: phases[h]["what_if"] for h in share if phases[h].get("what_if")}
    if wi:
        per = {h: (math.inf if w["speedup"] is None else w["speedup"]) for h, w in wi.items()}
        out["what_if"] = {"specs": next(iter(wi.values()))["specs"], "speedup": combine(per),
                          "per_phase": {h: wi[h]["speedup"] for h in wi}}
    return out
