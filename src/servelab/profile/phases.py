"""Phases of a serving trace and its warm-up steps: what the per-phase report is computed over.

A phase is the engine's own name for a step (steps.parse_step_name): SGLang's and the embedded
engine's ForwardMode (`DECODE`, `EXTEND`, `TARGET_VERIFY`, `DRAFT_EXTEND`, ...), vLLM's
`DECODE`/`PREFILL`/`MIXED` read from its `execute_context_..._generation_...` ranges. Each phase
has a role (decode, prefill, verify, draft, mixed) and each serving metric is set by some roles:
TPOT by decode steps (and, with MTP, by the verify and draft steps that replace them), TTFT by
prefill steps. Traces without engine names (`ProfilerStep#N`, `--step-regex`) form one phase,
`STEP`.

Warm-up steps are named and kept out of the steady-state figures. A step is warm-up when

1. it made a call that steady-state serving never makes (trace.WARMUP_CALLS): a CUDA-graph
   capture or instantiation, a module load (a freshly JIT-compiled kernel), whatever its length;
2. or it is a slow outlier of its phase: with at least MIN_SCREENED steps in the phase, its wall
   time exceeds both `median + MAD_K x 1.4826 x MAD` (MAD: median absolute deviation; 1.4826
   MAD estimates a standard deviation without being moved by the outliers themselves) and
   `MIN_RATIO x median`, so that a phase of near-identical steps does not lose its 5% slow
   ones. Only slow steps are screened: a compile, a capture or a first-batch allocation makes a
   step longer, never shorter. A cudaMalloc in such a step names the cause "allocation".

Phases of fewer than MIN_SCREENED steps cannot be screened by distribution (the report says so);
only the calls of rule 1 name their warm-up steps.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from servelab.profile.steps import Step, StepSet
from servelab.profile.trace import Trace

MIN_SCREENED = 3
MAD_K = 5.0  # a normal step lies beyond 5 sigma with probability 6e-7
MIN_RATIO = 2.0  # a compile is 7-27x (H200: 0.3-1.2 s vs 44 ms); a first profiled step 1.6x
UNNAMED_PHASE = "STEP"

ROLES = {
    "DECODE": "decode", "TARGET_VERIFY": "verify", "DRAFT_EXTEND": "draft",
    "DRAFT_EXTEND_V2": "draft", "DRAFT_DECODE": "draft", "EXTEND": "prefill",
    "PREFILL": "prefill", "SPLIT_PREFILL": "prefill", "MIXED": "mixed", "IDLE": "idle",
}
# The roles whose steps a serving metric waits on (MTP: a verify step and its drafts replace a
# decode step; MIXED steps carry both prefill chunks and decode tokens).
METRIC_ROLES = {"tpot": ("decode", "verify", "draft", "mixed"), "ttft": ("prefill", "mixed")}
METRICS = tuple(METRIC_ROLES)

_CAPTURE = ("Capture", "GraphInstantiate")
_LOAD = ("cuModuleLoad", "cuLibraryLoad")
_ALLOC = ("cudaMalloc", "cuMemAlloc", "cuMemCreate")


def role_of(phase: str) -> str:
    """decode | verify | draft | prefill | mixed | idle | step (no engine name) | other."""
    if phase == UNNAMED_PHASE:
        return "step"
    return ROLES.get(phase, "other")


def phase_of(step: Step) -> str:
    return step.phase or UNNAMED_PHASE


@dataclass(frozen=True, slots=True)
class Warmup:
    """A step kept out of the steady-state figures, and why."""

    index: int
    name: str
    phase: str
    wall_us: float
    reason: str


def _calls_in(trace: Trace, st: Step) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, ts, _ in trace.warmup_calls:
        if st.host_start_us <= ts <= st.host_end_us:
            out[name] = out.get(name, 0) + 1
    return out


def _named(calls: dict[str, int], kinds: tuple[str, ...]) -> str:
    return ", ".join(f"{n} x{k}" for n, k in sorted(calls.items()) if any(s in n for s in kinds))


def screen(trace: Trace, steps: StepSet) -> tuple[list[Warmup], dict[str, str]]:
    """Warm-up steps (module docstring's rule) and, per phase, how it was screened."""
    by_phase: dict[str, list[Step]] = {}
    for st in steps.steps:
        by_phase.setdefault(phase_of(st), []).append(st)
    found: list[Warmup] = []
    how: dict[str, str] = {}
    for phase, group in by_phase.items():
        walls = [st.wall_us for st in group]
        med = statistics.median(walls)
        screened = len(group) >= MIN_SCREENED
        limit = float("inf")
        if screened:
            mad = statistics.median(abs(w - med) for w in walls)
            limit = max(med + MAD_K * 1.4826 * mad, MIN_RATIO * med)
            how[phase] = (f"median {med:,.0f} us, MAD {mad:,.0f} us: slower than "
                          f"{limit:,.0f} us is warm-up")
        else:
            how[phase] = (f"{len(group)} step(s): too few to screen by distribution "
                          f"(needs {MIN_SCREENED}); only capture/compile calls name warm-up")
        for st in group:
            calls = _calls_in(trace, st)
            reasons = []
            if cap := _named(calls, _CAPTURE):
                reasons.append(f"CUDA-graph capture ({cap})")
            if load := _named(calls, _LOAD):
                reasons.append(f"kernel load / JIT compile ({load})")
            if st.wall_us > limit:
                slow = f"{st.wall_us / med:.1f}x the {phase} median step"
                if alloc := _named(calls, _ALLOC):
                    slow += f"; first-batch allocation ({alloc})"
                reasons.append(slow)
            if reasons:
                found.append(Warmup(st.index, st.name, phase, st.wall_us, "; ".join(reasons)))
    found.sort(key=lambda w: w.index)
    return found, how


def split(steps: StepSet, warm: list[Warmup]) -> dict[str, tuple[list[Step], list[Step]]]:
    """Per phase (in order of first appearance): (steady-state steps, warm-up steps)."""
    cold = {w.index for w in warm}
    out: dict[str, tuple[list[Step], list[Step]]] = {}
    for st in steps.steps:
        steady, warmup = out.setdefault(phase_of(st), ([], []))
        (warmup if st.index in cold else steady).append(st)
    return out


def parse_mix(text: str) -> dict[str, float]:
    """`decode=0.9,extend=0.1` -> {"DECODE": 0.9, "EXTEND": 0.1}: shares of serving time per
    phase (normalised to sum to 1). Names are phases or roles (prefill, decode, verify, ...)."""
    from servelab.errors import UserError

    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, val = part.partition("=")
        try:
            w = float(val) if sep else float("nan")
        except ValueError:
            w = float("nan")
        if not name.strip() or not w >= 0 or w == float("inf"):
            raise UserError(f"--mix {text!r}: write PHASE=SHARE pairs, e.g. decode=0.9,extend=0.1")
        out[name.strip().upper()] = out.get(name.strip().upper(), 0.0) + w
    total = sum(out.values())
    if not out or total <= 0:
        raise UserError(f"--mix {text!r}: the shares must add up to more than 0")
    return {k: v / total for k, v in out.items()}
