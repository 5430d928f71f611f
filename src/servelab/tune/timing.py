"""Timing one (M, N, K) block-FP8 GEMM problem under many configs: written once for every search.

CUDA: each config is timed as the median over `reps` replays of a CUDA graph holding `calls`
launches, each replay bracketed by a pair of CUDA events (calls chosen so a replay lasts
>= ~200 us, well above the event resolution). Every launch in the graph reads a different
copy of the inputs, rotated over enough copies to exceed twice the L2 (60 MiB on an H200), so
decode-sized problems are not measured L2-resident. Graph replay keeps Python's launch cost
out: on the H200 host a Triton launch from Python costs ~60 us, more than the kernel itself
at small M (seen 2026-11-29: a first version that queued launches behind a GPU spin measured
60-70 us for every small-M config, i.e. the launch rate).

CPU (`--device cpu`): Triton's interpreter, host wall clock: the pipeline runs, the numbers
mean nothing about any GPU, and every record says so.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servelab.tune.space import Config

if TYPE_CHECKING:
    from servelab.kernels.fp8_gemm.engine import EngineKernel

CUDA_METHOD = ("median over CUDA-graph replays (>= 200 us each) of CUDA-event time per call; "
               "inputs rotated over copies totalling >= 2x L2")
CPU_METHOD = "Triton interpreter on the CPU, host wall clock: MEANINGLESS as GPU timings"
TARGET_BATCH_US = 200.0


@dataclass(frozen=True, slots=True)
class Measurement:
    """One config timed on one problem; time_us is None when the config failed (error says why)."""

    n: int
    k: int
    m: int
    config: Config
    time_us: float | None
    spread_us: float | None      # half the interquartile range of the batch medians
    reps: int
    error: str | None = None


def quartile_spread(xs: list[float]) -> float | None:
    """Half the interquartile range (None for fewer than two values)."""
    if len(xs) < 2:
        return None
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return (q[2] - q[0]) / 2


class Problem:
    """Inputs of one (M, N, K) problem on one device, and `time(config, reps)`."""

    def __init__(self, n: int, k: int, m: int, device: str = "cuda", seed: int = 0,
                 l2_bytes: int | None = None, kernel: EngineKernel | None = None) -> None:
        """`kernel`: the launcher to time (an engine's own, kernels/fp8_gemm/engine.py);
        servelab's kernel when None."""
        import torch

        from servelab.kernels.fp8_gemm import reference
        self.n, self.k, self.m, self.device = n, k, m, device
        self._kernel = kernel
        gen = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(m, k, generator=gen, device=device)
        w = torch.randn(n, k, generator=gen, device=device) * 0.05
        a_q, a_s = reference.quantize_per_token_group(x)
        b_q, b_s = reference.quantize_weight_per_block(w)
        base = [a_q, a_s, b_q, b_s]
        if device == "cuda":
            if l2_bytes is None:
                props = torch.cuda.get_device_properties(torch.cuda.current_device())
                l2_bytes = int(getattr(props, "L2_cache_size", 60 << 20))
            set_bytes = sum(t.numel() * t.element_size() for t in base)
            copies = max(2, min(128, math.ceil(2 * l2_bytes / set_bytes)))
        else:
            copies = 1
        self.sets = [base] + [[t.clone() for t in base] for _ in range(copies - 1)]
        self.out = torch.empty((m, n), dtype=torch.bfloat16, device=device)
        self._next = 0

    def _launch(self, cfg: dict[str, int]) -> None:
        a_q, a_s, b_q, b_s = self.sets[self._next]
        self._next = (self._next + 1) % len(self.sets)
        if self._kernel is None:
            from servelab.kernels.fp8_gemm import kernel
            kernel.w8a8_block_fp8_matmul(a_q, a_s, b_q, b_s, cfg, out=self.out)
        else:
            self._kernel.launch(a_q, a_s, b_q, b_s, cfg, out=self.out)

    def time(self, config: Config, reps: int) -> Measurement:
        """Time `config`; any failure (compile, resources, launch) becomes an error record."""
        try:
            if self.device == "cuda":
                times = self._time_cuda(config.as_engine(), reps)
            else:
                times = self._time_cpu(config.as_engine(), reps)
        except Exception as exc:  # noqa: BLE001 - a failing config is noted and skipped
            msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            return Measurement(self.n, self.k, self.m, config, None, None, 0, msg[:300])
        return Measurement(self.n, self.k, self.m, config, statistics.median(times),
                           quartile_spread(times), len(times))

    def _time_cpu(self, cfg: dict[str, int], reps: int) -> list[float]:
        """One timed call whatever `reps` (interpreter timings are meaningless anyway)."""
        self._launch(cfg)                                   # first call: trace + checks
        t0 = time.perf_counter()
        self._launch(cfg)
        return [(time.perf_counter() - t0) * 1e6]

    def _time_cuda(self, cfg: dict[str, int], reps: int) -> list[float]:
        return cuda_time_us(lambda: self._launch(cfg), reps, min_calls=len(self.sets))


def cuda_time_us(launch, reps: int, min_calls: int = 1, max_calls: int = 128) -> list[float]:
    """Per-call GPU times (us) of `launch()`, one value per replay of a CUDA graph of `calls`
    launches (`launch` rotates its own inputs). Graph replay takes Python's launch cost
    (~60 us per Triton launch on the H200 host, more than a decode-sized GEMM) out of the
    numbers; a probe graph of 4 calls sizes `calls` so one replay lasts ~TARGET_BATCH_US."""
    import torch

    def graph_of(calls: int):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                launch()
        return g

    def replay_us(g, n: int) -> list[float]:
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
               for _ in range(n)]
        g.replay()                                           # warm: instantiate, caches
        for s, e in evs:
            s.record()
            g.replay()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) * 1e3 for s, e in evs]

    side = torch.cuda.Stream()                               # warm outside the capture
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    probe = min(replay_us(graph_of(4), 2)) / 4
    calls = max(min_calls, min(max_calls, math.ceil(TARGET_BATCH_US / max(probe, 0.5))))
    return [t / calls for t in replay_us(graph_of(calls), max(1, reps))]


def warm_up_gpu(seconds: float = 1.5) -> None:
    """Bring the GPU's clocks up before timing: the H200 idles at 345 MHz SM clock (seen
    2026-11-29), and the first configs of a run were measured up to 1.5x slow while it ramped."""
    import torch
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def method(device: str) -> str:
    """How timings on `device` are made, for the side file and the checkpoint."""
    return CUDA_METHOD if device == "cuda" else CPU_METHOD


def copy_rate_tbs(nbytes: int = 1 << 30, reps: int = 8) -> float:
    """Device-to-device copy rate (read + write, TB/s) of an `nbytes` tensor, timed with CUDA
    events outside any graph: captured into a graph the copy becomes a memcpy node that the copy
    engine serves at ~2.6-2.8 TB/s on the H200 (seen 2026-11-29), not the SMs' ~4.2 TB/s."""
    import torch
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ts = []
    for i in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        torch.cuda.synchronize()
        if i >= 2:                                   # the first copies ramp the clocks
            ts.append(s.elapsed_time(e) * 1e-3)
    ts.sort()
    return 2 * nbytes / ts[len(ts) // 2] / 1e12
