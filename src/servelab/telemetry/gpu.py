"""GPU telemetry through NVML (nvidia-ml-py, import name `pynvml`), in-process: per GPU, the
SM and memory clocks, power, the energy counter, temperature, utilisation and the clock event
(throttle) reasons, sampled every `interval_s` over a window by a thread.

Where NVML cannot start (no driver, no GPU, the package missing) the sampler says so ONCE:
`GpuSeries.status` is "n/a: <why>" and there are no samples; nothing is printed per sample. A
reading a GPU does not support (power on some boards, the energy counter before Volta) is None
in every sample and named once in `unsupported`.

The library is reached only through the `nvml` object (the module by default), so the tests
inject a stand-in for the library boundary.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

NA = "n/a"
DEFAULT_INTERVAL_S = 1.0

# NVML's clocks-event (throttle) reason bits (nvml.h, nvmlClocksEventReason*), our names
THROTTLE_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# the reasons that mean the GPU ran slower than it could (idle and settings are not throttling)
SLOWDOWNS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown",
                       "hw_thermal_slowdown", "hw_power_brake_slowdown"})


def decode_throttle(mask: int | None) -> list[str] | None:
    """The reason names of a bitmask (unknown bits as `unknown_0x...`); None stays None."""
    if mask is None:
        return None
    names = [n for bit, n in THROTTLE_BITS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_BITS)
    if rest:
        names.append(f"unknown_{rest:#x}")
    return names


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU; None where NVML could not say."""

    t_s: float
    gpu: int
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    power_w: float | None
    energy_mj: int | None  # NVML's total energy since the driver loaded, millijoules
    temperature_c: int | None
    util_gpu_pct: int | None
    util_mem_pct: int | None
    throttle_mask: int | None


@dataclass(slots=True)
class GpuSeries:
    """The samples of a window; `status` "ok", "n/a: <why>" (said once) or "failed after N
    samples: <why>" (the library raised something unexpected mid-window), `gpus` what each
    sampled GPU is, `unsupported` readings a GPU could not give (named once)."""

    interval_s: float
    status: str = "ok"
    gpus: list[dict[str, Any]] = field(default_factory=list)
    samples: list[GpuSample] = field(default_factory=list)
    unsupported: dict[int, list[str]] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        return self.status == "ok"

    def of(self, gpu: int) -> list[GpuSample]:
        return [s for s in self.samples if s.gpu == gpu]

    def throttling(self) -> dict[int, dict[str, float]]:
        """Per GPU, each slowdown reason seen and the share of samples it was active in."""
        out: dict[int, dict[str, float]] = {}
        for g in {s.gpu for s in self.samples}:
            rows = [s for s in self.of(g) if s.throttle_mask is not None]
            seen: dict[str, int] = {}
            for s in rows:
                for name in decode_throttle(s.throttle_mask) or []:
                    if name in SLOWDOWNS or name.startswith("unknown"):
                        seen[name] = seen.get(name, 0) + 1
            out[g] = {k: n / len(rows) for k, n in seen.items()}  # a count: 1.0 is exact
        return out

    def to_json(self) -> dict[str, Any]:
        """Columnar per GPU (t_s and one list per reading), the status and the throttling."""
        per: dict[str, Any] = {}
        for g in sorted({s.gpu for s in self.samples}):
            rows = self.of(g)
            cols = {k: [getattr(s, k) for s in rows] for k in GpuSample.__slots__ if k != "gpu"}
            cols["throttle"] = [decode_throttle(s.throttle_mask) for s in rows]
            per[str(g)] = cols
        return {"status": self.status, "interval_s": self.interval_s, "gpus": self.gpus,
                "unsupported": {str(k): v for k, v in self.unsupported.items()},
                "series": per, "throttling": {str(k): v for k, v in self.throttling().items()}}


def _load_nvml() -> Any:
    import pynvml  # nvidia-ml-py: pure Python, loads libnvidia-ml only at nvmlInit

    return pynvml


class GpuSampler:
    """Sample `gpus` (NVML indices; None: every GPU) every `interval_s` between start() and
    stop() (or as a context manager). `nvml`: the pynvml module, or a stand-in."""

    def __init__(self, gpus: list[int] | None = None, interval_s: float = DEFAULT_INTERVAL_S,
                 nvml: Any = None) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.want, self.nvml = gpus, nvml
        self.series = GpuSeries(interval_s=interval_s)
        self._handles: list[tuple[int, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = 0.0

    def _init(self) -> bool:
        """Start NVML and find the GPUs; False (and the status says why, once) when it can't."""
        try:
            nv = self.nvml = self.nvml or _load_nvml()
        except ImportError as exc:
            self.series.status = f"{NA}: nvidia-ml-py not installed ({exc})"
            return False
        try:
            nv.nvmlInit()
            n = nv.nvmlDeviceGetCount()
            idx = list(range(n)) if self.want is None else self.want
            bad = [i for i in idx if not 0 <= i < n]
            if bad:
                self.series.status = f"{NA}: GPU {bad} not among the {n} NVML sees"
                return False
            for i in idx:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                self._handles.append((i, h))
                info: dict[str, Any] = {"index": i, "name": _str(self._try(nv.nvmlDeviceGetName, h))}
                lim = self._try(nv.nvmlDeviceGetEnforcedPowerLimit, h)
                info["power_limit_w"] = lim / 1000.0 if lim is not None else None
                self.series.gpus.append(info)
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, NoPermission...
            self.series.status = f"{NA}: {type(exc).__name__}: {exc}"[:200]
            return False
        if not self._handles:
            self.series.status = f"{NA}: no NVIDIA GPU"
            return False
        return True

    def _try(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            if isinstance(exc, self._nvml_error()):
                return None
            raise

    def _nvml_error(self) -> type[BaseException]:
        return getattr(self.nvml, "NVMLError", Exception)

    def _reason_fn(self) -> Any:
        nv = self.nvml
        return getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons

    def sample_once(self) -> None:
        nv, t = self.nvml, time.monotonic() - self.t0
        reasons = self._reason_fn()
        for i, h in self._handles:
            r: dict[str, Any] = {
                "sm_clock_mhz": self._try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                "mem_clock_mhz": self._try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                "power_w": self._try(nv.nvmlDeviceGetPowerUsage, h),  # milliwatts
                "energy_mj": self._try(nv.nvmlDeviceGetTotalEnergyConsumption, h),
                "temperature_c": self._try(nv.nvmlDeviceGetTemperature, h,
                                           nv.NVML_TEMPERATURE_GPU),
                "util": self._try(nv.nvmlDeviceGetUtilizationRates, h),
                "throttle_mask": self._try(reasons, h),
            }
            missing = [k for k, v in r.items() if v is None]
            if missing and i not in self.series.unsupported:
                self.series.unsupported[i] = missing  # named once, from the first sample
            util = r.pop("util")
            self.series.samples.append(GpuSample(
                t_s=t, gpu=i, sm_clock_mhz=r["sm_clock_mhz"], mem_clock_mhz=r["mem_clock_mhz"],
                power_w=r["power_w"] / 1000.0 if r["power_w"] is not None else None,
                energy_mj=r["energy_mj"], temperature_c=r["temperature_c"],
                util_gpu_pct=getattr(util, "gpu", None), util_mem_pct=getattr(util, "memory", None),
                throttle_mask=r["throttle_mask"]))

    def start(self) -> GpuSampler:
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self.t0 = time.monotonic()
        if not self._init():
            return self  # n/a: said once in the status, nothing to sample
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        k = 0
        try:
            while True:
                self.sample_once()
                k = max(k + 1, int((time.monotonic() - self.t0) / self.series.interval_s) + 1)
                if self._stop.wait(max(0.0, self.t0 + k * self.series.interval_s
                                       - time.monotonic())):
                    self.sample_once()  # the window's end
                    return
        except Exception as exc:  # a thread's death is silent: the status says it, once
            self.series.status = f"failed after {len(self.series.samples)} samples: " \
                                 f"{type(exc).__name__}: {exc}"[:200]

    def stop(self) -> GpuSeries:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(10)
            self._thread = None
            try:
                self.nvml.nvmlShutdown()
            except Exception as exc:
                if not isinstance(exc, self._nvml_error()):
                    raise
        return self.series

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def state(nvml: Any = None) -> tuple[str, list[dict[str, Any]]]:
    """One reading of every GPU now, with what a sampler does not follow over time: the SM
    clock's maximum and the compute processes (pids). (status, per GPU dicts); the status is
    "n/a: <why>" with no GPUs where NVML cannot start."""
    smp = GpuSampler(nvml=nvml)
    if not smp._init():
        return smp.series.status, []
    try:
        smp.sample_once()
        nv, out = smp.nvml, []
        for (_, h), s in zip(smp._handles, smp.series.samples, strict=True):
            procs = smp._try(nv.nvmlDeviceGetComputeRunningProcesses, h)
            out.append({**smp.series.gpus[len(out)], "sample": s,
                        "sm_clock_max_mhz": smp._try(nv.nvmlDeviceGetMaxClockInfo, h,
                                                     nv.NVML_CLOCK_SM),
                        "pids": None if procs is None else [int(p.pid) for p in procs]})
        return "ok", out
    finally:
        try:
            smp.nvml.nvmlShutdown()
        except Exception as exc:
            if not isinstance(exc, smp._nvml_error()):
                raise


def _str(x: Any) -> str | None:
    return x.decode() if isinstance(x, bytes) else x

