"""What-if on the GPU timeline: a category or kernel made free or s times faster (Amdahl, honestly).

Each step's timeline is cut into elementary segments at every activity start and end. A segment
where nothing runs is idle and stays (making kernels faster does not remove host gaps). A segment
where activities run shrinks to `max(f_a)` of its length, with `f_a = 1/s` for an activity the
what-if speeds up (0 when free) and 1 for any other: a sped-up kernel that overlaps untouched
work on another stream saves nothing there. With no overlap this is Amdahl's law per step:
T' = T - t_c (1 - 1/s). A step's new time is its wall time minus the least any device saved.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from servelab.errors import UserError
from servelab.profile.breakdown import Breakdown
from servelab.profile.steps import StepSet, by_device, clipped_intervals
from servelab.profile.trace import Trace


def amdahl(fraction: float, speedup: float = math.inf) -> float:
    """Whole-program speedup when `fraction` of the time gets `speedup` times faster."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    rest = 0.0 if math.isinf(speedup) else fraction / speedup
    return 1.0 / ((1.0 - fraction) + rest)


@dataclass(frozen=True, slots=True)
class WhatIf:
    """`target` (a category, or a kernel-name regex when `kernel` is True) runs `speedup` x faster."""

    spec: str
    target: str
    kernel: bool
    speedup: float  # math.inf: free

    @property
    def factor(self) -> float:
        return 0.0 if math.isinf(self.speedup) else 1.0 / self.speedup


def parse_whatif(spec: str, categories: list[str], kernel_names: list[str]) -> WhatIf:
    """Parse `attention=free`, `moe=2x`, `gemm=1.5` or `kernel:REGEX=free`."""
    if "=" not in spec:
        raise UserError(
            f"--what-if {spec!r}: write TARGET=free or TARGET=Nx (e.g. attention=free, moe=2x)"
        )
    target, _, value = spec.rpartition("=")
    target, value = target.strip(), value.strip().lower()
    if value == "free":
        s = math.inf
    else:
        try:
            s = float(value[:-1] if value.endswith("x") else value)
        except ValueError:
            s = float("nan")
        if not s > 0 or math.isnan(s):
            raise UserError(f"--what-if {spec!r}: {value!r} is not 'free' or a speedup like 2x")
    if target.startswith("kernel:"):
        pat = target[len("kernel:") :]
        return WhatIf(spec, _kernel_regex(spec, pat, kernel_names), True, s)
    if target in categories:
        return WhatIf(spec, target, False, s)
    try:
        rx = re.compile(target)
    except re.error:
        rx = None
    if rx is not None and any(rx.search(n) for n in kernel_names):
        return WhatIf(spec, target, True, s)
    raise UserError(
        f"--what-if {spec!r}: {target!r} is neither a category ({', '.join(categories)}) nor "
        "part of a kernel name in this trace (use kernel:REGEX for kernels)"
    )


def _kernel_regex(spec: str, pat: str, kernel_names: list[str]) -> str:
    try:
        rx = re.compile(pat)
    except re.error as exc:
        raise UserError(f"--what-if {spec!r}: bad kernel regex: {exc}") from None
    if not any(rx.search(n) for n in kernel_names):
        raise UserError(f"--what-if {spec!r}: no kernel name in this trace matches {pat!r}")
    return pat


def scaled_busy(starts: list[float], ends: list[float], factors: list[float]) -> tuple[float, float]:
    """(busy, new busy) of intervals on one device when interval i shrinks by `factors[i]`."""
    events = sorted(
        [(s, 1, f) for s, f in zip(starts, factors, strict=True)]
        + [(e, -1, f) for e, f in zip(ends, factors, strict=True)]
    )
    active: dict[float, int] = {}
    busy = new = 0.0
    prev = None
    for t, delta, f in events:
        if prev is not None and t > prev and active:
            seg = t - prev
            busy += seg
            new += seg * max(active)
        active[f] = active.get(f, 0) + delta
        if active[f] == 0:
            del active[f]
        prev = t
    return busy, new


def exclusive_by_label(starts: list[float], ends: list[float], labels: list[str]) -> dict[str, float]:
    """Time during which only intervals of one label are running, per label."""
    events = sorted(
        [(s, 1, lab) for s, lab in zip(starts, labels, strict=True)]
        + [(e, -1, lab) for e, lab in zip(ends, labels, strict=True)]
    )
    active: dict[str, int] = {}
    out: dict[str, float] = {}
    prev = None
    for t, delta, lab in events:
        if prev is not None and t > prev and len(active) == 1:
            (only,) = active
            out[only] = out.get(only, 0.0) + (t - prev)
        active[lab] = active.get(lab, 0) + delta
        if active[lab] == 0:
            del active[lab]
        prev = t
    return out


@dataclass(frozen=True, slots=True)
class WhatIfResult:
    """Step time before and after a set of what-ifs, summed over the steps."""

    specs: list[str]
    wall_us: float
    new_wall_us: float
    busy_us: float
    new_busy_us: float
    matched: dict[str, int] = field(default_factory=dict)  # spec -> activities it decided

    @property
    def speedup(self) -> float:
        return self.wall_us / self.new_wall_us if self.new_wall_us > 0 else math.inf


def apply_whatifs(
    trace: Trace, steps: StepSet, bd: Breakdown, whatifs: list[WhatIf]
) -> WhatIfResult:
    """Apply all `whatifs` together (the first that matches an activity decides its factor)."""
    rx = {w.spec: re.compile(w.target) for w in whatifs if w.kernel}
    matched = {w.spec: 0 for w in whatifs}
    wall = new_wall = busy_all = new_busy_all = 0.0
    for st in steps.steps:
        saved: list[float] = []
        busy_main = new_main = 0.0
        for idx in by_device(trace, st.activities).values():
            starts, ends = clipped_intervals(trace, idx, st.start_us)
            factors = []
            for i in idx:
                f = 1.0
                for w in whatifs:
                    hit = (
                        rx[w.spec].search(trace.names[trace.name_idx[i]])
                        if w.kernel
                        else bd.activity_category.get(i) == w.target
                    )
                    if hit:
                        f = w.factor
                        matched[w.spec] += 1
                        break
                factors.append(f)
            b, nb = scaled_busy(starts, ends, factors)
            saved.append(b - nb)
            if b >= busy_main:
                busy_main, new_main = b, nb
        wall += st.wall_us
        new_wall += st.wall_us - (min(saved) if saved else 0.0)
        busy_all += busy_main
        new_busy_all += new_main
    return WhatIfResult([w.spec for w in whatifs], wall, new_wall, busy_all, new_busy_all, matched)


@dataclass(frozen=True, slots=True)
class Gain:
    """The most a category could give: its exclusive timeline time made free."""

    category: str
    share: float  # of kernel time
    exclusive_us: float
    max_speedup: float


def rank_categories(trace: Trace, steps: StepSet, bd: Breakdown) -> list[Gain]:
    """Every category ranked by the speedup if it were free (best first)."""
    wall = sum(st.wall_us for st in steps.steps)
    excl: dict[str, float] = {}
    for st in steps.steps:
        per_dev: list[dict[str, float]] = []
        for idx in by_device(trace, st.activities).values():
            starts, ends = clipped_intervals(trace, idx, st.start_us)
            per_dev.append(exclusive_by_label(starts, ends, [bd.activity_category[i] for i in idx]))
        for row in bd.categories:
            excl[row.category] = excl.get(row.category, 0.0) + min(
                (d.get(row.category, 0.0) for d in per_dev), default=0.0
            )
    gains = [
        Gain(
            r.category,
            r.share,
            excl.get(r.category, 0.0),
            wall / (wall - excl.get(r.category, 0.0)) if wall > excl.get(r.category, 0.0) else math.inf,
        )
        for r in bd.categories
    ]
    return sorted(gains, key=lambda g: g.max_speedup, reverse=True)
