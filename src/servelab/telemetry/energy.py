"""Energy of a window and per output token, from the GPU samples (gpu.py).

Per GPU, the joules of [t_a, t_b] come from NVML's energy counter when it has one (millijoules
since the driver loaded: the difference between the samples at the window's ends), else from
the power samples integrated over time (trapezoids; a sample every second misses spikes
shorter than that, so the counter is preferred). The counter is an unsigned 64-bit number: a
decrease is a wrap (modulo 2^64), unless the wrapped difference is impossible for the board
(more than `MAX_W` watts over the interval), which is a reset (driver reload), and that
interval is integrated from power instead. The window's joules sum the deployment's GPUs; when
one GPU has neither counter nor power, the total is None (a partial sum would read low).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from servelab.telemetry.gpu import GpuSample, GpuSeries

WRAP = 1 << 64  # nvmlDeviceGetTotalEnergyConsumption: unsigned long long, mJ
MAX_W = 10_000.0  # no accelerator board draws 10 kW: a larger "delta" is a counter reset

Source = Literal["counter", "power", "mixed"]


@dataclass(frozen=True, slots=True)
class Energy:
    """Joules over a window, and per output token; `source` says how they were measured."""

    joules: float
    seconds: float
    source: Source
    output_tokens: int | None = None

    @property
    def j_per_token(self) -> float | None:
        return self.joules / self.output_tokens if self.output_tokens else None

    @property
    def tokens_per_j(self) -> float | None:
        return self.output_tokens / self.joules if self.output_tokens and self.joules > 0 else None

    @property
    def mean_power_w(self) -> float | None:
        return self.joules / self.seconds if self.seconds > 0 else None


def _interval_j(a: GpuSample, b: GpuSample) -> tuple[float | None, str | None]:
    dt = b.t_s - a.t_s
    if a.energy_mj is not None and b.energy_mj is not None:
        d = (b.energy_mj - a.energy_mj) % WRAP  # a decrease reads as a wrap
        if d / 1e3 <= MAX_W * max(dt, 1e-3):
            return d / 1e3, "counter"
    if a.power_w is not None and b.power_w is not None:
        return (a.power_w + b.power_w) / 2 * dt, "power"
    return None, None


def gpu_joules(samples: Sequence[GpuSample], t_a: float | None = None,
               t_b: float | None = None) -> tuple[float, str] | None:
    """(joules, source) of one GPU between the first sample at or after t_a and the last at or
    before t_b; None with fewer than two samples or an interval with neither reading."""
    rows = sorted((s for s in samples if (t_a is None or s.t_s >= t_a)
                   and (t_b is None or s.t_s <= t_b)), key=lambda s: s.t_s)
    if len(rows) < 2:
        return None
    total, sources = 0.0, set()
    for a, b in zip(rows, rows[1:], strict=False):
        j, src = _interval_j(a, b)
        if j is None:
            return None
        total += j
        sources.add(src)
    return total, sources.pop() if len(sources) == 1 else "mixed"


def window(series: GpuSeries, t_a: float | None = None, t_b: float | None = None,
           output_tokens: int | None = None) -> Energy | None:
    """Energy of every sampled GPU over [t_a, t_b] (the series' clock) and per output token;
    None where NVML was n/a or a GPU could not be measured."""
    if not series.available or not series.samples:
        return None
    total, sources, spans = 0.0, set(), []
    for g in sorted({s.gpu for s in series.samples}):
        rows = [s for s in series.of(g) if (t_a is None or s.t_s >= t_a)
                and (t_b is None or s.t_s <= t_b)]
        got = gpu_joules(rows)
        if got is None:
            return None
        total += got[0]
        sources.add(got[1])
        spans.append(rows[-1].t_s - rows[0].t_s)
    src: Source = sources.pop() if len(sources) == 1 else "mixed"  # type: ignore[assignment]
    return Energy(joules=total, seconds=max(spans), source=src, output_tokens=output_tokens)
