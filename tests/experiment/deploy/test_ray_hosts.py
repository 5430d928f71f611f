"""Processes placed on Ray, seen from the driver (experiment/deploy/ray_hosts.py and the cluster
view in ray_nodes.py), without a cluster: what fits a node, the one-line text of a cluster, and
a placement refused before any actor is asked for. The whole path on a real cluster is
scenarios/test_ray_placement.py."""

from __future__ import annotations

import pytest

from servelab.engines.base import ProcessConfig
from servelab.engines.launcher import Placement
from servelab.experiment.deploy import ray_hosts
from servelab.experiment.deploy.base import DeployError
from servelab.experiment.deploy.ray_nodes import Node, cluster_text, unplaceable

NODE = Node("c" * 16, "10.0.0.4", {"CPU": 4, "GPU": 2, "node:__internal_head__": 1},
            {"CPU": 1, "GPU": 2}, {"tier": "decode", "ray.io/node-id": "c" * 16})


def test_a_node_fits_by_its_resources_and_exact_labels():
    asks = Placement(kind="ray", num_cpus=2, num_gpus=1, node_labels=(("tier", "decode"),))
    assert NODE.fits(asks)  # the node's total, idle
    assert not NODE.fits(asks, NODE.free)  # 1 CPU free now
    assert not NODE.fits(Placement(kind="ray", node_labels=(("tier", "prefill"),)))


def test_the_cluster_text_leaves_rays_bookkeeping_out():
    text = cluster_text([NODE])
    assert text == "node 10.0.0.4 (cccccccc): CPU=1, GPU=2, label tier=decode"
    assert cluster_text([]) == "no live node"
    assert unplaceable(Placement(kind="ray", num_gpus=1), "decode", [NODE]) is None
    why = unplaceable(Placement(kind="ray", num_gpus=4), "decode", [NODE])
    assert why is not None and why.startswith("no node of the Ray cluster can hold the decode")


def test_place_refuses_what_no_live_node_could_hold_before_asking_for_an_actor(monkeypatch):
    monkeypatch.setattr(ray_hosts, "connect", lambda address: object())
    monkeypatch.setattr(ray_hosts, "nodes", lambda ray: [NODE])
    monkeypatch.setattr(ray_hosts, "_request", lambda cfg: pytest.fail("an actor was asked for"))
    cfg = ProcessConfig(role="decode", flags={}, placement=Placement(kind="ray", num_gpus=8))
    with pytest.raises(DeployError, match="no node of the Ray cluster can hold the decode"):
        ray_hosts.place([cfg], timeout_s=1.0)
