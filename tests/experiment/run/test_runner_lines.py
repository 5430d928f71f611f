"""What the runner says as it goes (experiment/run/runner.py, record.py): an experiment decided
on energy on a host whose GPUs give no energy readings says so before its first run, not as
`n/a` verdicts after its last; each run's line shows its primary metric's value and unit."""

from __future__ import annotations

import pytest
from fake_nvml import FakeNVML

from servelab.experiment.design.parse import parse
from servelab.experiment.run.measurement import Measurement
from servelab.experiment.run.runner import Runner
from servelab.store import Store
from servelab.telemetry import gpu as gpu_telemetry


def _lines(tmp_path, primary: str) -> list[str]:
    spec = parse({"name": f"e-{primary}", "engine": "external", "url": "http://127.0.0.1:1",
                  "arms": {"a": {}, "b": {}}, "load": {"concurrency": [1]}, "repetitions": 1,
                  "primary_metric": primary})
    lines: list[str] = []
    summary = {"output_throughput_tok_s": 100.0, "completed": 2, "failed": 0}
    with Store(tmp_path / f"{primary}.db") as store:
        Runner(spec, store, measure=lambda url, sp, run: Measurement(summary, []),
               say=lines.append, log_root=tmp_path / "logs").run()
    return lines


@pytest.mark.parametrize("primary", ["j_per_output_token", "output_tokens_per_j"])
def test_energy_decided_without_nvml_is_warned_once_before_the_runs(tmp_path, monkeypatch,
                                                                    primary):
    def missing():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(gpu_telemetry, "_load_nvml", missing)
    lines = _lines(tmp_path, primary)
    warned = [i for i, x in enumerate(lines) if x.startswith(f"warning: primary_metric {primary}")]
    assert len(warned) == 1, lines
    assert "n/a: nvidia-ml-py not installed" in lines[warned[0]]
    assert not any("deployed" in x or "run " in x for x in lines[:warned[0]]), lines


def test_no_warning_with_gpu_readings_or_another_primary_metric(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_telemetry, "_load_nvml", lambda: FakeNVML(1))
    assert not any("primary_metric" in x for x in _lines(tmp_path, "j_per_output_token"))
    monkeypatch.setattr(gpu_telemetry, "_load_nvml", lambda: (_ for _ in ()).throw(ImportError()))
    assert not any("primary_metric" in x for x in _lines(tmp_path, "output_throughput_tok_s"))


@pytest.mark.parametrize("primary,summary,shown", [
    ("ttft_ms", {"ttft_ms": {"median": 77.01, "p99": 120.0}}, "ttft_ms 77.01 ms,"),
    ("output_throughput_tok_s", {"output_throughput_tok_s": 431.5}, "output_throughput_tok_s 431.5 tok/s,"),
    ("j_per_output_token", {}, "j_per_output_token n/a J/tok,"),
])
def test_each_runs_line_shows_the_primary_metrics_value(tmp_path, monkeypatch, primary, summary,
                                                        shown):
    """The line a run prints reads the primary metric where the statistics read it (a latency
    is its median, not its stats object), with its unit; n/a when it was not measured."""
    monkeypatch.setattr(gpu_telemetry, "_load_nvml", lambda: FakeNVML(1))
    spec = parse({"name": "line", "engine": "external", "url": "http://127.0.0.1:1",
                  "arms": {"a": {}, "b": {}}, "load": {"concurrency": [1]}, "repetitions": 1,
                  "primary_metric": primary})
    lines: list[str] = []
    with Store(tmp_path / "r.db") as store:
        Runner(spec, store, measure=lambda url, sp, run: Measurement(
            {**summary, "completed": 2, "failed": 0}, []), say=lines.append,
            log_root=tmp_path / "logs").run()
    ok = [x for x in lines if x.startswith("ok arm")]
    assert len(ok) == 2 and all(shown in x for x in ok), lines
