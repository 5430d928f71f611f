"""`tune fp8-gemm --ray local` starts its own Ray instance. Before, it called `ray.init()` with
no address, which Ray resolves to RAY_ADDRESS or the latest cluster started on the machine
(/tmp/ray/ray_current_cluster): the units ran on whatever cluster another user had up (seen
here: the Ray test joined another process's cluster and failed). Ray's own address resolution
(`canonicalize_bootstrap_address`) judges what the call asks for."""

from __future__ import annotations

import pytest


class _Stop(Exception):
    pass


def test_ray_local_never_joins_the_cluster_running_on_the_machine(monkeypatch):
    ray = pytest.importorskip("ray")
    from ray._private import services

    from servelab.tune.workers import RayPool

    asked: dict = {}

    def init(*args, **kw):
        asked.update(kw, args=args)
        raise _Stop

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")          # someone else's cluster
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(_Stop):
        RayPool(None, "local", lambda s: None).start()
    address = asked["args"][0] if asked["args"] else asked.get("address")
    assert services.canonicalize_bootstrap_address(address) is None   # Ray: start a new one
    asked.clear()
    with pytest.raises(_Stop):                                    # an address is used as given
        RayPool(None, "10.0.0.5:6379", lambda s: None).start()
    assert asked.get("address") == "10.0.0.5:6379"


def test_a_cluster_without_gpus_is_a_one_line_error_not_a_wait(monkeypatch):
    """Each unit is a task with num_gpus=1: on a cluster with no GPU it would never be
    scheduled, and the job waited forever on the probe task."""
    ray = pytest.importorskip("ray")
    from servelab.errors import UserError
    from servelab.tune.workers import RayPool

    monkeypatch.setattr(ray, "is_initialized", lambda: True)            # already connected
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 16.0, "memory": 1e9})
    monkeypatch.setattr(ray, "get", lambda *a, **k: pytest.fail("waited on a task"))
    with pytest.raises(UserError, match=r"--ray local: the Ray cluster has no GPU"):
        RayPool(None, "local", lambda s: None).start()
