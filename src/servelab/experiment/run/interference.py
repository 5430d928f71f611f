"""What else the machine did while a run was measured: load average, CPU steal, the CPU time of
processes that are not ours, and on GPUs clocks, temperature, power, throttle reasons and
foreign GPU processes (NVML through telemetry/gpu.py, in-process).

Why: on a shared machine a verdict is only as good as the machine was quiet. Every run stores
this record in its provenance (`interference`), the report shows it beside the run, and the
runner can pause or repeat a block whose record crossed a threshold (spec `[noise]`).
CPU numbers come from /proc (Linux); elsewhere they are None, never 0.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from servelab.telemetry import gpu as gpu_telemetry

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Counters at one instant; two of them make a record."""

    t: float  # time.monotonic()
    cpu: tuple[int, ...] | None  # /proc/stat 'cpu' line, jiffies
    ours: dict[int, int]  # pid -> utime + stime (jiffies) of our processes
    load1: float | None


def _proc_stat() -> tuple[int, ...] | None:
    try:
        with open("/proc/stat") as f:
            first = f.readline().split()
    except OSError:
        return None
    return tuple(int(x) for x in first[1:]) if first and first[0] == "cpu" else None


def _cpu_ticks(pid: int) -> int | None:
    """utime + stime of a process (all its threads), jiffies."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def snapshot(our_pids: Iterable[int]) -> Snapshot:
    ours = {p: t for p in set(our_pids) if (t := _cpu_ticks(p)) is not None}
    try:
        load1: float | None = os.getloadavg()[0]
    except OSError:
        load1 = None
    return Snapshot(time.monotonic(), _proc_stat(), ours, load1)


@dataclass(frozen=True, slots=True)
class Interference:
    """The machine during one run. `other_cpu_cores`: CPU used by processes that are neither the
    runner (the client) nor a deployed engine, in cores (1.0 = one core busy all along)."""

    duration_s: float
    cpu_count: int | None
    load1_start: float | None
    load1_end: float | None
    steal_frac: float | None  # share of all CPU time the hypervisor gave to other guests
    other_cpu_cores: float | None
    our_cpu_cores: float | None
    gpu: list[dict[str, Any]] | None = None  # per GPU: sm clock, temperature, foreign processes
    flagged: str | None = None  # why this run crossed a threshold, None when it did not

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def record(before: Snapshot, after: Snapshot, *, gpu: bool = True) -> Interference:
    """The interference between two snapshots (the pids of `before` are the ones counted ours;
    a pid that appeared later counts from zero)."""
    dt = max(after.t - before.t, 1e-9)
    steal = other = mine = None
    if before.cpu and after.cpu and len(before.cpu) >= 8 and len(after.cpu) >= 8:
        d = [a - b for a, b in zip(after.cpu, before.cpu, strict=False)]
        total = sum(d[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
        busy = d[0] + d[1] + d[2] + d[5] + d[6]
        steal = d[7] / total if total > 0 else None
        ours = sum(t - before.ours.get(p, 0) for p, t in after.ours.items())
        mine = ours / _HZ / dt
        other = max(0.0, (busy - ours) / _HZ / dt)
    return Interference(
        duration_s=dt,
        cpu_count=os.cpu_count(),
        load1_start=before.load1,
        load1_end=after.load1,
        steal_frac=steal,
        other_cpu_cores=other,
        our_cpu_cores=mine,
        gpu=gpu_state(set(after.ours)) if gpu else None,
    )


def gpu_state(our_pids: set[int], nvml: Any = None) -> list[dict[str, Any]] | None:
    """Per GPU: SM clock and its maximum (MHz), temperature (C), utilization (%), power (W),
    the slowdown (throttle) reasons active, and compute processes that are not ours; None where
    NVML cannot start (no driver or GPU: telemetry/gpu.py, in-process, no nvidia-smi). A
    reading the board does not give is None."""
    status, gpus = gpu_telemetry.state(nvml)
    if status != "ok":
        return None
    out = []
    for g in gpus:
        s = g["sample"]
        reasons = gpu_telemetry.decode_throttle(s.throttle_mask)
        out.append({
            "index": float(g["index"]),  # stored as nvidia-smi's CSV gave it (a float)
            "sm_clock_mhz": _f(s.sm_clock_mhz),
            "sm_clock_max_mhz": _f(g["sm_clock_max_mhz"]),
            "temperature_c": _f(s.temperature_c),
            "utilization_pct": _f(s.util_gpu_pct),
            "foreign_pids": [p for p in g["pids"] or [] if p not in our_pids],
            "power_w": s.power_w,
            "throttle": None if reasons is None else
            [r for r in reasons if r in gpu_telemetry.SLOWDOWNS or r.startswith("unknown")],
        })
    return out or None


def _f(x: float | None) -> float | None:
    return None if x is None else float(x)


def crossed(rec: Interference, max_other_cpu: float | None, max_steal: float | None) -> str | None:
    """Why `rec` crossed a threshold (one phrase), or None."""
    why = []
    if max_other_cpu is not None and rec.other_cpu_cores is not None:
        if rec.other_cpu_cores > max_other_cpu:
            why.append(f"other processes used {rec.other_cpu_cores:.2f} cores > {max_other_cpu:g}")
    if max_steal is not None and rec.steal_frac is not None and rec.steal_frac > max_steal:
        why.append(f"CPU steal {rec.steal_frac * 100:.1f}% > {max_steal * 100:g}%")
    return "; ".join(why) or None


def sample(our_pids: Iterable[int], seconds: float = 2.0) -> Interference:
    """The machine now, over `seconds` (for pausing until it is quiet)."""
    pids = list(our_pids)
    before = snapshot(pids)
    time.sleep(seconds)
    return record(before, snapshot(pids), gpu=False)
