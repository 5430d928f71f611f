"""A stand-in for nvidia-ml-py (`pynvml`) at the library boundary, for the GPU telemetry's
tests on machines without a GPU: pynvml's function names and units (mW, mJ, MHz)."""

from __future__ import annotations

import time


class FakeNVML:
    """pynvml's surface, two GPUs: GPU 0 draws 300 W (its energy counter advances 300 J per
    second of monotonic time), throttled by the power cap and heat; GPU 1 has no energy
    counter or power reading (NotSupported), like a pre-Volta board."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):  # noqa: N801 (pynvml's name)
        pass

    class Util:
        gpu, memory = 87, 41

    def __init__(self, count: int = 2) -> None:
        self.count, self.t0, self.shutdown = count, time.monotonic(), False

    def nvmlInit(self):  # noqa: N802
        pass

    def nvmlShutdown(self):  # noqa: N802
        self.shutdown = True

    def nvmlDeviceGetCount(self):  # noqa: N802
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return ("handle", i)

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return b"NVIDIA H200" if h[1] == 0 else "Tesla P100"

    def nvmlDeviceGetEnforcedPowerLimit(self, h):  # noqa: N802
        return 700_000  # mW

    def nvmlDeviceGetClockInfo(self, h, kind):  # noqa: N802
        return 1980 if kind == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetPowerUsage(self, h):  # noqa: N802
        if h[1] == 1:
            raise self.NVMLError_NotSupported()
        return 300_000  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, h):  # noqa: N802
        if h[1] == 1:
            raise self.NVMLError_NotSupported()
        return 5_000_000 + int((time.monotonic() - self.t0) * 300_000)  # mJ at 300 W

    def nvmlDeviceGetTemperature(self, h, kind):  # noqa: N802
        return 71

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        return self.Util()

    def nvmlDeviceGetMaxClockInfo(self, h, kind):  # noqa: N802
        return 1980 if kind == self.NVML_CLOCK_SM else 3201

    class Proc:
        def __init__(self, pid: int) -> None:
            self.pid, self.usedGpuMemory = pid, 1 << 30

    def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
        return [self.Proc(4242)] if h[1] == 0 else [self.Proc(777)]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):  # noqa: N802
        return 0x4 | 0x40 if h[1] == 0 else 0x1
