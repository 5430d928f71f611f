"""How the runner measures one run (experiment/run/measure.py): a load point with servelab.bench
against a live (scripted) server, the model name the engine serves, and the dispatch of a
capacity run to its sweep."""

from __future__ import annotations

from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script
from servelab.experiment.design.parse import parse
from servelab.experiment.plan.schedule import PlannedRun
from servelab.experiment.run import measure
from servelab.experiment.run.measurement import Measurement, served_model


def _spec(engine: str = "external", **extra: object):
    return parse({"name": "m", "engine": engine, "url": "http://127.0.0.1:1", "model": "tiny",
                  "arms": {"a": {}, "b": {}}, "load": {"concurrency": [2]},
                  "workload": {"input_len": 8, "output_len": 5, "num_prompts": 6}, **extra})


def _run(load_key: str = "c=2") -> PlannedRun:
    return PlannedRun(seq=0, arm="a", load_key=load_key, concurrency=2, request_rate=None,
                      repetition=0, block=0, group=0)


def test_a_load_point_is_measured_with_the_bench_and_its_configuration_kept():
    with serve_in_thread(Script(ttft_ms=2, gap_ms=1)) as srv:
        m = measure.bench_measure(srv.url, _spec(), _run())
    assert isinstance(m, Measurement) and m.extra_points == []
    assert m.summary["completed"] == 6 and len(m.records) == 6
    assert m.bench["base_url"] == srv.url and m.bench["workload"]["num_prompts"] == 6


def test_a_capacity_run_is_one_sweep(monkeypatch):
    seen = []
    monkeypatch.setattr(measure.sweeps, "measure", lambda url, spec, run: seen.append(run) or "m")
    spec = _spec(load={"sweep": {"slo": "ttft_p99_ms=2000"}})
    assert measure.bench_measure("http://x", spec, _run("capacity")) == "m" and len(seen) == 1


def test_served_model_is_the_name_the_engine_serves():
    assert served_model(_spec()) is None  # external: the bench asks the server
    sg = parse({"name": "s", "engine": "sglang", "model": "org/m", "arms": {"a": {}, "b": {}},
                "load": {"concurrency": [1]}})
    assert served_model(sg) == "org/m"
    named = sg.model_copy(update={"base": sg.base.model_copy(
        update={"flags": {"served-model-name": "alias"}})})
    assert served_model(named) == "alias"
