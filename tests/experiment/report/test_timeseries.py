"""The time-series panel's data (experiment/report/timeseries.py) from stored series as the
telemetry writes them (ServerSeries.to_json, GpuSeries.to_json): a counter's rate per scrape
interval, a failed scrape a gap (never 0), the GPUs' clock averaged and power summed only where
every GPU reads it."""

from __future__ import annotations

import pytest

from servelab.experiment.report.timeseries import Panels, run_series
from servelab.telemetry.gpu import GpuSample, GpuSeries
from servelab.telemetry.server import ServerSeries


def _stored(power_gpu1: float | None) -> dict:
    srv = ServerSeries(url="http://127.0.0.1:1/metrics", interval_s=1.0)
    for i, (gen, q) in enumerate([(0.0, 3.0), (100.0, 5.0), (None, None), (400.0, 1.0)]):
        if gen is None:
            srv.add(float(i), None, error="OSError: refused")  # a failed scrape
        else:
            srv.add(float(i), {"generation_tokens": gen, "queued_requests": q})
    gpu = GpuSeries(interval_s=1.0, gpus=[{"index": 0}, {"index": 1}])
    for t in range(4):
        for g, clock, power in ((0, 1980, 300.0), (1, 1500, power_gpu1)):
            gpu.samples.append(GpuSample(t + 0.25, g, clock, 3201, power, None, 60, 90, 40, 0))
    return {"load_start_s": 0.5, "load_end_s": 3.0, "gpu_clock_offset_s": 0.05,
            "server": srv.to_json(), "gpu": gpu.to_json()}


def test_rates_gaps_and_gpu_aggregates_from_a_stored_series():
    got = run_series(_stored(power_gpu1=200.0))
    t, rate = got["gen_tok_s"]
    assert t == [0.0, 1.0, 2.0]  # interval midpoints, from the load's start (0.5 s)
    assert rate == [100.0, None, None]  # across the failed scrape: a gap, not 0
    assert got["queued_requests"] == ([-0.5, 0.5, 1.5, 2.5], [3.0, 5.0, None, 1.0])
    assert "kv_cache_usage_pct" not in got  # not served: left out
    t, clock = got["sm_clock_mhz"]
    assert t == pytest.approx([-0.2, 0.8, 1.8, 2.8])  # sampler clock + offset - load start
    assert clock == [1740.0] * 4  # mean of 1980 and 1500
    assert got["power_w"][1] == [500.0] * 4  # summed over the GPUs


def test_a_gpu_without_power_leaves_power_out_with_a_note():
    got = run_series(_stored(power_gpu1=None))
    assert "power_w" not in got and "sm_clock_mhz" in got  # a partial sum would read low
    pan = Panels(arms=["a"], load_keys=["c=1"], runs={"c=1": {"block 1": {"a": got}}},
                 gpu_status={"c=1": "ok"})
    assert pan.shown("c=1") == ["gen_tok_s", "queued_requests", "sm_clock_mhz"]
    assert pan.missing_notes("c=1") == [
        "KV-cache usage: not measured (the engine's /metrics does not serve it); left out, "
        "not drawn as 0",
        "GPU power (sum over GPUs): not measured (a GPU gives no such reading); left out, "
        "not drawn as 0"]


def test_no_gpu_gives_no_gpu_series():
    tel = _stored(power_gpu1=200.0)
    tel["gpu"] = GpuSeries(interval_s=1.0, status="n/a: no NVIDIA GPU").to_json()
    got = run_series(tel)
    assert set(got) == {"gen_tok_s", "queued_requests"}
    pan = Panels(arms=["a"], load_keys=["c=1"], runs={"c=1": {"block 1": {"a": got}}},
                 gpu_status={"c=1": "n/a: no NVIDIA GPU"})
    assert "SM clock (mean over GPUs): not measured (GPU telemetry n/a: no NVIDIA GPU)" in \
        pan.missing_notes("c=1")[1]


def test_loads_shorter_than_a_few_scrapes_are_named_with_the_remedy():
    from servelab.experiment.report.timeseries import _note_coarse

    pan = Panels(arms=["a"], load_keys=["c=1", "c=4"],
                 runs={"c=1": {"block 1": {"a": {}}}, "c=4": {"block 1": {"a": {}}}})
    short, long_ = _stored(200.0), _stored(200.0)
    short["load_end_s"] = 1.8  # 1.3 s of load, 1-s scrapes
    long_["load_end_s"] = 20.5
    _note_coarse(pan, "c=1", long_)
    _note_coarse(pan, "c=1", short)
    _note_coarse(pan, "c=4", long_)
    assert pan.coarse == {"c=1": (pytest.approx(1.3), 1.0)}
    assert pan.missing_notes("c=1")[-1].startswith(
        "loads as short as 1.3 s against a scrape every 1 s: a few samples per run; "
        "[workload] scrape_interval_s")
    assert not any("scrape_interval_s" in n for n in pan.missing_notes("c=4"))


def test_the_stops_short_last_interval_is_no_rate_spike():
    srv = ServerSeries(url="http://127.0.0.1:1/metrics", interval_s=1.0)
    for t, gen in ((0.0, 0.0), (1.0, 50.0), (2.0, 100.0), (2.04, 110.0)):  # last: at stop
        srv.add(t, {"generation_tokens": gen})
    tel = {"load_start_s": 0.0, "load_end_s": 2.04, "server": srv.to_json(),
           "gpu": GpuSeries(interval_s=1.0, status="n/a: no NVIDIA GPU").to_json()}
    t, rate = run_series(tel)["gen_tok_s"]
    assert t == [0.5, 1.5] and rate == [50.0, 50.0]  # not 250 tok/s over the last 0.04 s


def test_a_load_shorter_than_one_scrape_keeps_its_only_rate():
    srv = ServerSeries(url="http://127.0.0.1:1/metrics", interval_s=1.0)
    for t, gen in ((0.0, 0.0), (0.3, 60.0)):  # a 0.3-s load: the stop's scrape is all there is
        srv.add(t, {"generation_tokens": gen})
    tel = {"load_start_s": 0.0, "load_end_s": 0.3, "server": srv.to_json(),
           "gpu": GpuSeries(interval_s=1.0, status="n/a: no NVIDIA GPU").to_json()}
    assert run_series(tel)["gen_tok_s"] == ([0.15], [200.0])
