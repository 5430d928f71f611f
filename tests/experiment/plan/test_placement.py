"""Which Ray node each process would land on (experiment/plan/placement.py), from a cluster's
nodes as Ray reports them (here given, no Ray needed): the first node with room, asks that add
up when every arm of a block is up at once, and one-line refusals naming what the cluster has."""

from __future__ import annotations

import pytest

from servelab.errors import UserError
from servelab.experiment.deploy.ray_nodes import Node
from servelab.experiment.design.parse import parse
from servelab.experiment.plan import placement


def _spec(restart: str = "run", gpus: float = 1):
    srv = ["prog", "--port", "{port}"]
    return parse({
        "name": "p", "engine": "command", "placement": "ray", "restart": restart,
        "base": {"processes": [
            {"role": "server", "command": srv, "num_gpus": gpus, "node_labels": {"tier": "gpu"}},
        ]},
        "arms": {"a": {}, "b": {"env": {"X": "1"}}}, "load": {"concurrency": [1]},
    })


def _cluster(monkeypatch, *live: Node) -> None:
    monkeypatch.setattr(placement, "connect", lambda address: None)
    monkeypatch.setattr(placement, "nodes", lambda ray: list(live))


GPU_NODE = Node("a" * 16, "10.0.0.2", {"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 1},
                {"tier": "gpu"})
CPU_NODE = Node("b" * 16, "10.0.0.3", {"CPU": 8}, {"CPU": 8}, {"tier": "cpu"})


def test_each_arm_lands_on_the_node_whose_labels_and_resources_fit(monkeypatch):
    _cluster(monkeypatch, CPU_NODE, GPU_NODE)
    got = placement.predict(_spec())
    want = {"node_id": "a" * 16, "ip": "10.0.0.2", "candidates": 1}
    assert got == {"a": [want], "b": [want]}  # one arm at a time: the GPU is free again


def test_restart_block_adds_the_arms_asks_and_is_refused_in_one_line(monkeypatch):
    _cluster(monkeypatch, CPU_NODE, GPU_NODE)
    with pytest.raises(UserError) as e:
        placement.predict(_spec(restart="block"), "f.toml")
    msg = str(e.value)
    assert msg.startswith("f.toml: arms.b (server): no node has room for it now") and "\n" not in msg
    assert 'restart = "block"' in msg and "node 10.0.0.2" in msg


def test_a_process_no_node_could_ever_hold_names_what_the_cluster_has(monkeypatch):
    _cluster(monkeypatch, CPU_NODE, GPU_NODE)
    with pytest.raises(UserError, match="no node of the Ray cluster can hold the server process"):
        placement.predict(_spec(gpus=2))
