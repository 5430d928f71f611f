"""The machine during a run (experiment/run/interference.py): foreign CPU time counted as other
and ours as ours, and GPU clocks, temperature and foreign processes read from nvidia-smi."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from fake_nvml import FakeNVML

from servelab.experiment.run import interference

BUSY = [sys.executable, "-c", "while True: pass"]


def _ticks(pid: int) -> int:
    """utime + stime of `pid` read here, independently of the module under test."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def _busy_for(seconds: float, ours: bool) -> tuple[interference.Interference, float]:
    """The record over `seconds` with one busy-loop process counted as ours or not, and the
    cores that process really used (from its own counters)."""
    p = subprocess.Popen(BUSY)
    try:
        time.sleep(0.3)
        pids = [os.getpid()] + ([p.pid] if ours else [])
        t0, before = _ticks(p.pid), interference.snapshot(pids)
        time.sleep(seconds)
        after, t1 = interference.snapshot(pids), _ticks(p.pid)
        rec = interference.record(before, after, gpu=False)
        return rec, (t1 - t0) / os.sysconf("SC_CLK_TCK") / rec.duration_s
    finally:
        p.kill()
        p.wait()


def test_interference_counts_foreign_cpu_time_as_other_and_ours_as_ours():
    # on a shared machine the busy loop gets what the scheduler gives it: compare with that
    foreign, used = _busy_for(1.5, ours=False)
    assert used > 0.1, "the busy loop got no CPU at all"
    assert foreign.other_cpu_cores is not None and foreign.other_cpu_cores >= 0.8 * used
    assert foreign.our_cpu_cores is not None and foreign.our_cpu_cores < 0.5 * used
    mine, used = _busy_for(1.5, ours=True)
    assert mine.our_cpu_cores >= 0.8 * used  # the busy child is ours now: counted on our side
    assert 0.0 <= mine.steal_frac <= 1.0 and mine.cpu_count == os.cpu_count()
    assert mine.load1_start is not None and abs(mine.duration_s - 1.5) < 0.5
    why = interference.crossed(foreign, max_other_cpu=0.05, max_steal=None)
    assert why and "cores > 0.05" in why
    assert interference.crossed(foreign, max_other_cpu=None, max_steal=None) is None
    assert interference.gpu_state(set()) is None or isinstance(interference.gpu_state(set()), list)


def test_gpu_state_reads_clocks_temperature_power_throttling_and_foreign_processes():
    # NVML's readings through telemetry/gpu.py (FakeNVML: GPU 0 at 300 W, power-capped and
    # hot; GPU 1 gives no power); pid 4242 is ours. The fields stored before NVML keep their
    # names and types (floats, as nvidia-smi's CSV gave them); power and throttle are added.
    nv = FakeNVML()
    g = interference.gpu_state({4242}, nvml=nv)
    assert g == [
        {"index": 0.0, "sm_clock_mhz": 1980.0, "sm_clock_max_mhz": 1980.0,
         "temperature_c": 71.0, "utilization_pct": 87.0, "foreign_pids": [],
         "power_w": 300.0, "throttle": ["sw_power_cap", "hw_thermal_slowdown"]},
        {"index": 1.0, "sm_clock_mhz": 1980.0, "sm_clock_max_mhz": 1980.0,
         "temperature_c": 71.0, "utilization_pct": 87.0, "foreign_pids": [777],
         "power_w": None, "throttle": []},  # idle is not a slowdown
    ]
    assert nv.shutdown  # NVML is shut down after the one reading


def test_gpu_state_is_none_where_nvml_cannot_start():
    class NoDriver(FakeNVML):
        def nvmlInit(self):  # noqa: N802
            raise self.NVMLError("Driver Not Loaded")

    assert interference.gpu_state(set(), nvml=NoDriver()) is None
