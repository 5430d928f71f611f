"""GPU telemetry. No GPU is lent to this session's tests, so: the no-GPU path runs the real
nvidia-ml-py against this machine (no driver: "n/a", once); the decoding and the sampler run
against `FakeNVML`, a stand-in for the library boundary (pynvml's function names and units:
mW, mJ, MHz), whose values make the arithmetic checkable. The real-GPU path is untested here."""

from __future__ import annotations

import time

import pytest
from fake_nvml import FakeNVML

from servelab.telemetry import gpu as gpu_mod
from servelab.telemetry.energy import window
from servelab.telemetry.gpu import NA, GpuSampler, decode_throttle


def test_throttle_reasons_are_decoded_to_names():
    assert decode_throttle(0) == []
    assert decode_throttle(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_throttle(0x1 | 0x8000) == ["gpu_idle", "unknown_0x8000"]
    assert decode_throttle(None) is None


def test_one_sample_reads_every_field_in_our_units():
    nv = FakeNVML()
    s = GpuSampler(nvml=nv)
    assert s._init()
    s.sample_once()
    s.sample_once()
    g0, g1 = s.series.of(0), s.series.of(1)
    assert len(g0) == len(g1) == 2
    a = g0[0]
    assert (a.sm_clock_mhz, a.mem_clock_mhz, a.power_w, a.temperature_c) == (1980, 3201, 300.0, 71)
    assert (a.util_gpu_pct, a.util_mem_pct) == (87, 41) and a.energy_mj >= 5_000_000
    assert g1[0].power_w is None and g1[0].energy_mj is None  # not supported: None, not 0
    assert s.series.unsupported == {1: ["power_w", "energy_mj"]}  # named once, not per sample
    assert s.series.gpus[0] == {"index": 0, "name": "NVIDIA H200", "power_limit_w": 700.0}
    doc = s.series.to_json()
    assert doc["series"]["0"]["throttle"][0] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert doc["throttling"] == {"0": {"sw_power_cap": 1.0, "hw_thermal_slowdown": 1.0}, "1": {}}


def test_the_sampler_thread_and_the_energy_of_its_window():
    """GPU 0 alone at 300 W for ~0.4 s sampled every 0.05 s: the counter's joules are 300 W x
    the sampled span, to the counter's 1-mJ steps."""
    nv = FakeNVML()
    with GpuSampler(gpus=[0], interval_s=0.05, nvml=nv) as s:
        time.sleep(0.4)
    rows = s.series.of(0)
    assert 7 <= len(rows) <= 11 and nv.shutdown
    e = window(s.series, output_tokens=600)
    span = rows[-1].t_s - rows[0].t_s
    assert e is not None and e.source == "counter"
    assert abs(e.joules - 300.0 * span) < 0.02 * 300.0 * span + 0.01  # the counter's clock vs ours
    assert e.j_per_token == pytest.approx(e.joules / 600)
    assert e.tokens_per_j == pytest.approx(600 / e.joules)


def test_a_gpu_with_neither_counter_nor_power_gives_no_energy():
    nv = FakeNVML()
    s = GpuSampler(nvml=nv)
    s._init()
    s.sample_once()
    s.sample_once()
    assert window(s.series, output_tokens=10) is None  # GPU 1 unmeasurable: no partial sum


def test_no_gpu_here_is_na_once_with_the_real_library():
    """This machine has no NVIDIA driver: the real pynvml fails at nvmlInit."""
    with GpuSampler(interval_s=0.01) as s:
        time.sleep(0.05)
    assert s.series.status.startswith(f"{NA}: ") and "NVML" in s.series.status
    assert s.series.samples == [] and not s.series.available
    assert window(s.series, output_tokens=100) is None
    assert s.series.to_json()["status"] == s.series.status


def test_no_package_is_na_once(monkeypatch):
    def missing():
        raise ImportError("No module named 'pynvml'")
    monkeypatch.setattr(gpu_mod, "_load_nvml", missing)
    s = GpuSampler().start()
    assert s.series.status.startswith(f"{NA}: nvidia-ml-py not installed")
    assert s.stop().samples == []


def test_asking_for_a_gpu_that_is_not_there():
    s = GpuSampler(gpus=[0, 5], nvml=FakeNVML()).start()
    assert "GPU [5] not among the 2" in s.series.status and s.stop().samples == []


def test_an_unexpected_library_error_mid_window_is_said_not_swallowed():
    class Breaks(FakeNVML):
        calls = 0

        def nvmlDeviceGetTemperature(self, h, kind):  # noqa: N802
            Breaks.calls += 1
            if Breaks.calls > 3:
                raise OSError("driver went away")
            return 71

    with GpuSampler(gpus=[0], interval_s=0.01, nvml=Breaks()) as s:
        time.sleep(0.1)
    assert s.series.status.startswith("failed after 3 samples: OSError: driver went away")
    assert not s.series.available and window(s.series, output_tokens=5) is None
