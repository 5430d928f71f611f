"""Steps of a trace (forward passes), the GPU work each launched, and its busy and idle time.

A step is an annotated host range: `ProfilerStep#N` (torch.profiler's `prof.step()`), SGLang's
`step[DECODE bs=N]` / `step[EXTEND ...]` / `step[TARGET_VERIFY ...]`, or whatever `--step-regex`
names. GPU work belongs to the step whose host range contains the runtime call that launched it
(matched by correlation id; all kernels of one `cudaGraphLaunch` share its id), so work that runs
after the host moved on still counts for the step that asked for it. A step lasts from its host
start to the later of its host end and its last GPU activity's end; when the host runs ahead of
the GPU (an overlap scheduler launching step k+1 while step k's kernels still run), step k+1
starts only where step k ended, so steps never overlap and a GPU kept busy back to back reads as
busy, not as idle. GPU busy time is the union of the step's activity intervals (within its window)
per device; idle = wall - busy.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass

from servelab.errors import UserError
from servelab.profile.trace import Annotation, Trace, launch_times

# Preferred first: the engines' forward-pass ranges sit inside ProfilerStep ranges when both
# exist. SGLang's ModelRunner.forward writes `step[MODE bs=N ...]`, MODE a ForwardMode name
# (`step[EXTEND bs=1 toks=1025 ...]`, `step[DECODE bs=64 ...]`, `step[MIXED bs=66 c=2 g=64 ...]`,
# `step[TARGET_VERIFY bs=N]`, `step[DRAFT_EXTEND_V2 bs=N]`; its first release of the spans, PR
# 23419, wrote them lower-case: `step[decode bs=N]`, `step[prefill bs=N toks=T]`, `step[idle]`),
# as does the embedded engine; vLLM's worker writes
# `execute_context_{ctx reqs}({ctx tokens})_generation_{gen reqs}({gen tokens})`.
STEP_PATTERNS = (r"^step\[", r"^execute_context_\d+\(\d+\)_generation_", r"^ProfilerStep#\d+$")
_PHASE_RE = re.compile(r"step\[(?P<phase>[A-Za-z][A-Za-z0-9_]*)(?:.*?\bbs=(?P<bs>\d+))?")
_VLLM_RE = re.compile(
    r"execute_context_(?P<nc>\d+)\((?P<ct>\d+)\)_generation_(?P<ng>\d+)\((?P<gt>\d+)\)"
)


def parse_step_name(name: str) -> tuple[str | None, int | None]:
    """(phase, batch size) of an engine's step annotation, (None, None) for other names.

    vLLM batches prefill and decode together: a step with only generation requests is DECODE
    (batch = their count), one with only context requests PREFILL, one with both MIXED."""
    m = _PHASE_RE.match(name)
    if m:
        return m.group("phase").upper(), int(m.group("bs")) if m.group("bs") else None
    m = _VLLM_RE.match(name)
    if m:
        nc, ng = int(m.group("nc")), int(m.group("ng"))
        phase = "MIXED" if nc and ng else "PREFILL" if nc else "DECODE"
        return phase, nc + ng
    return None, None


@dataclass(frozen=True, slots=True)
class Step:
    """One step: its window, the GPU activities it launched, and busy time per device."""

    index: int
    name: str
    start_us: float  # the later of the host start and the previous step's end
    end_us: float
    host_end_us: float
    activities: tuple[int, ...]
    busy_us: dict[int, float]  # device -> union of activity intervals
    n_graph_launches: int
    n_graph_activities: int
    host_start_us: float  # the annotation's start (start_us is later when the host ran ahead)

    @property
    def host_ran_ahead(self) -> bool:
        """The host began this step while the previous step's GPU work still ran."""
        return self.start_us > self.host_start_us

    @property
    def wall_us(self) -> float:
        return self.end_us - self.start_us

    @property
    def gpu_busy_us(self) -> float:
        """Busy time of the busiest device (the one that bounds the step)."""
        return max(self.busy_us.values(), default=0.0)

    @property
    def idle_fraction(self) -> float:
        return 1.0 - self.gpu_busy_us / self.wall_us if self.wall_us > 0 else float("nan")

    @property
    def phase(self) -> str | None:
        return parse_step_name(self.name)[0]

    @property
    def batch_size(self) -> int | None:
        return parse_step_name(self.name)[1]


@dataclass(frozen=True, slots=True)
class StepSet:
    """The steps of a trace and how they were found."""

    steps: list[Step]
    source: str  # e.g. "annotation ^step\\[ (host)", "whole trace (no step annotations)"
    outside_activities: tuple[int, ...]  # GPU work launched outside every step


def union_length(starts: list[float], ends: list[float]) -> float:
    """Length of the union of intervals [s, e) (sort, then merge)."""
    if not starts:
        return 0.0
    order = sorted(range(len(starts)), key=starts.__getitem__)
    total = 0.0
    cur_s = starts[order[0]]
    cur_e = ends[order[0]]
    for i in order[1:]:
        s, e = starts[i], ends[i]
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    return total + (cur_e - cur_s)


def by_device(trace: Trace, idx: Iterable[int]) -> dict[int, list[int]]:
    """Activity indices `idx` grouped by device, in order of first appearance."""
    per: dict[int, list[int]] = {}
    for i in idx:
        per.setdefault(trace.device[i], []).append(i)
    return per


def busy_by_device(
    trace: Trace, idx: list[int] | tuple[int, ...], from_us: float = float("-inf")
) -> dict[int, float]:
    """Union of the intervals of activities `idx` (the parts after `from_us`), per device."""
    per = by_device(trace, idx)
    return {d: union_length(*clipped_intervals(trace, ix, from_us)) for d, ix in sorted(per.items())}


def clipped_intervals(trace: Trace, idx: list[int], from_us: float) -> tuple[list[float], list[float]]:
    """(starts, ends) of activities `idx`, cut to begin no earlier than `from_us` (a step's start)."""
    starts = [max(trace.ts_us[i], from_us) for i in idx]
    ends = [max(trace.ts_us[i] + trace.dur_us[i], from_us) for i in idx]
    return starts, ends


def _pick_annotations(
    trace: Trace, step_regex: str | None
) -> tuple[list[Annotation], str]:
    patterns = [step_regex] if step_regex else list(STEP_PATTERNS)
    for pat in patterns:
        try:
            rx = re.compile(pat)
        except re.error as exc:
            raise UserError(f"--step-regex {pat!r} is not a valid regular expression: {exc}") from None
        for gpu in (False, True):
            found = [a for a in trace.annotations if a.gpu == gpu and rx.search(a.name)]
            if found:
                return found, f"annotation {pat} ({'GPU' if gpu else 'host'} ranges)"
    if step_regex:
        names = sorted({a.name for a in trace.annotations})[:12]
        raise UserError(
            f"--step-regex {step_regex!r} matches no annotation in {trace.path}; "
            f"annotations there include: {', '.join(names) or 'none'}"
        )
    return [], "whole trace (no ProfilerStep#N or step[...] annotations)"


def _drop_nested(anns: list[Annotation]) -> list[Annotation]:
    out: list[Annotation] = []
    for a in sorted(anns, key=lambda a: (a.ts_us, -a.dur_us)):
        if out and a.ts_us >= out[-1].ts_us and a.end_us <= out[-1].end_us:
            continue  # nested inside the previous step (e.g. a regex matching both levels)
        out.append(a)
    return out


def step_annotations(trace: Trace) -> list[tuple[str | None, int | None]]:
    """(phase, batch size) of each step annotation in time order; none for a trace without."""
    anns, _ = _pick_annotations(trace, None)
    return [parse_step_name(a.name) for a in _drop_nested(anns)]


def find_steps(trace: Trace, step_regex: str | None = None) -> StepSet:
    """Find the steps of `trace` and attribute every GPU activity to one (or to none)."""
    if trace.n_gpu == 0:
        raise UserError(
            f"{trace.path}: the trace has no GPU events (no 'kernel', 'gpu_memcpy' or "
            "'gpu_memset'); record it with ProfilerActivity.CUDA (SGLang: activities "
            '["CPU", "GPU"]) on a machine with a GPU'
        )
    anns, source = _pick_annotations(trace, step_regex)
    anns = _drop_nested(anns)
    n = trace.n_gpu
    if not anns:
        start = min(trace.ts_us)
        end = max(trace.ts_us[i] + trace.dur_us[i] for i in range(n))
        anns = [Annotation("whole trace", start, end - start, gpu=True)]
    gpu_windows = anns[0].gpu
    starts = [a.ts_us for a in anns]
    members: list[list[int]] = [[] for _ in anns]
    outside: list[int] = []
    launches = launch_times(trace)
    for i in range(n):
        if gpu_windows:
            t = trace.ts_us[i]
        else:
            launch = launches.get(trace.corr[i])
            t = launch[0] if launch is not None else trace.ts_us[i]
        k = bisect.bisect_right(starts, t) - 1
        if k >= 0 and t <= anns[k].end_us:
            members[k].append(i)
        else:
            outside.append(i)
    steps = []
    prev_end = float("-inf")
    for k, (a, idx) in enumerate(zip(anns, members, strict=True)):
        end = max([a.end_us] + [trace.ts_us[i] + trace.dur_us[i] for i in idx])
        start = min(max(a.ts_us, prev_end), end)  # host ran ahead: begin where the last step ended
        prev_end = max(prev_end, end)
        graph_corrs = {trace.corr[i] for i in idx if launches.get(trace.corr[i], (0, False))[1]}
        n_graph_act = sum(1 for i in idx if launches.get(trace.corr[i], (0, False))[1])
        steps.append(
            Step(
                index=k,
                name=a.name,
                start_us=start,
                end_us=end,
                host_end_us=a.end_us,
                activities=tuple(idx),
                busy_us=busy_by_device(trace, idx, start),
                n_graph_launches=len(graph_corrs),
                n_graph_activities=n_graph_act,
                host_start_us=a.ts_us,
            )
        )
    return StepSet(steps=steps, source=source, outside_activities=tuple(outside))
