"""Placement keys in the experiment file (no cluster needed): one-line errors, what a process
asks of Ray, the design hash of experiments that do not use Ray, and Ray staying optional."""

from __future__ import annotations

import sys

import pytest

from servelab.errors import UserError
from servelab.experiment.design.parse import parse
from servelab.experiment.plan import processes
from servelab.experiment.plan.preflight import load
from servelab.experiment.run.runner import Runner
from servelab.store import Store


def _pd(**top: object) -> dict:
    srv = [sys.executable, "-m", "servelab.bench.scripted", "--port", "{port}"]
    return {
        "name": "pd", "engine": "command", "placement": "ray",
        "base": {"processes": [
            {"role": "prefill", "command": srv, "resources": {"node:prefill": 1}},
            {"role": "decode", "command": srv, "num_gpus": 2, "node_labels": {"tier": "decode"}},
            {"role": "router", "command": srv, "placement": "local"},
        ]},
        "arms": {"a": {}, "b": {"flags": {"x": 1}}},
        "load": {"concurrency": [1]},
        **top,
    }


def test_each_process_asks_ray_for_what_the_file_says():
    spec = parse(_pd(ray_address="ray://head:10001"))
    pre, dec, rtr = processes.resolve(spec, "a")
    assert pre.placement.ray and pre.placement.address == "ray://head:10001"
    assert pre.placement.asks() == {"node:prefill": 1.0}
    assert dec.placement.asks() == {"GPU": 2.0} and dec.placement.node_labels == (("tier", "decode"),)
    assert not rtr.placement.ray  # the process's own placement beats the experiment's
    ip = parse(_pd(base={"processes": [
        {"role": "server", "command": ["x", "{port}"], "node_ip": "10.0.0.7", "num_cpus": 2}]}))
    assert processes.resolve(ip, "a")[0].placement.asks() == {"CPU": 2.0, "node:10.0.0.7": 0.001}


def test_an_arm_moves_the_processes_its_delta_applies_to():
    d = _pd(placement="local")
    d["arms"]["b"]["placement"] = "ray"
    d["arms"]["b"]["roles"] = ["decode"]
    spec = parse(d)
    assert [c.placement.kind for c in processes.resolve(spec, "a")] == ["local", "local", "local"]
    assert [c.placement.kind for c in processes.resolve(spec, "b")] == ["local", "ray", "local"]


@pytest.mark.parametrize(("patch", "message"), [
    ({"ray_address": "http://x"}, "ray_address 'http://x' must be \"auto\""),
    ({"placement": "slurm"}, "placement: Input should be 'local' or 'ray'"),
    ({"placement": "local"}, "base.processes.0 (prefill) sets resources, which only applies with"),
    ({"proc": {"resources": {"GPU": 1}}}, "ask for GPU with num_gpus, not in resources"),
    ({"proc": {"resources": {"node:prefill": 0}}}, "resource 'node:prefill' must be a name"),
    ({"proc": {"node_ip": "node7"}}, "'node7' is not an IP address"),
    ({"proc": {"num_gpus": -1}}, "num_gpus: Input should be greater than or equal to 0"),
    ({"proc": {"node_labels": {"tier": "a b"}}}, "label tier = 'a b'"),
    ({"proc": {"num_gpus": 1, "env": {"CUDA_VISIBLE_DEVICES": "0"}}},
     "CUDA_VISIBLE_DEVICES comes from the GPUs Ray gives the process"),
])
def test_bad_placement_keys_are_one_line_errors(patch, message):
    d = _pd()
    d["base"]["processes"][0].update(patch.pop("proc", {}))
    d.update(patch)
    with pytest.raises(UserError) as err:
        parse(d, "x.toml")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("x.toml: ")


def test_design_hash_ignores_unset_placement_and_the_address():
    local = {k: v for k, v in _pd().items() if k != "placement"}
    for p in local["base"]["processes"]:
        for k in ("resources", "num_gpus", "node_labels", "placement"):
            p.pop(k, None)
    plain = parse(local)
    explicit = parse({**local, "placement": "local"})
    assert plain.design_hash() == explicit.design_hash()  # files from before placement resume
    on_ray = parse({**local, "placement": "ray"})
    assert on_ray.design_hash() != plain.design_hash()  # where engines run is the design
    moved = parse({**local, "placement": "ray", "ray_address": "10.0.0.1:6379"})
    assert moved.design_hash() == on_ray.design_hash()  # a restarted head keeps the design


def test_without_ray_local_runs_unchanged_and_ray_placement_says_how_to_install(
        tmp_path, monkeypatch, scripted, live_procs):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if not installed
    text, marker = scripted("noray", reps=1, loads="[1]", prompts=3)
    f = tmp_path / "noray.toml"
    f.write_text(text)
    res = Runner(load(f), Store(tmp_path / "r.db"), say=lambda s: None).run()
    assert (res.ok, res.failed) == (2, 0)
    assert live_procs(marker) == []
    f.write_text(text.replace('restart = "arm"', 'restart = "arm"\nplacement = "ray"'))
    with pytest.raises(UserError) as err:
        load(f)
    assert str(err.value) == (
        f"{f}: placement = \"ray\" needs Ray, which is not installed: pip install 'servelab[ray]'")


def test_the_ray_example_passes_preflight_and_each_process_asks_for_its_node():
    from pathlib import Path

    ex = Path(__file__).resolve().parents[3] / "examples" / "disagg_ray.toml"
    spec = load(ex)
    for arm in spec.arms:
        asks = [c.placement.asks() for c in processes.resolve(spec, arm)]
        assert asks == [{"node:prefill": 1.0, "GPU": 8.0}, {"node:decode": 1.0, "GPU": 8.0},
                        {"node:router": 1.0}]
        for cmd in processes.planned(spec, arm):  # judged without a cluster (the flag tables)
            assert cmd.verdict is not None and cmd.verdict.ok, (arm, cmd.role, cmd.verdict)
