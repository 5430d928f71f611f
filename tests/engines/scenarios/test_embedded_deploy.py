"""The embedded engine as a deployment: launched, ready, described, scraped, torn down."""

from __future__ import annotations

from servelab import engines
from servelab.engines.base import ProcessConfig
from servelab.experiment.deploy.deployment import Deployment
from servelab.experiment.deploy.ports import port_free


def test_embedded_engine_deploys_reports_its_flags_and_goes_away(tmp_path):
    eng = engines.get("embedded")
    flags = {
        "device": "cpu",
        "speculative-algorithm": "EAGLE",
        "speculative-num-steps": 1,
        "speculative-eagle-topk": 1,
        "speculative-num-draft-tokens": 2,
    }
    dep = Deployment(
        eng,
        "tiny",
        [ProcessConfig(role="server", flags=flags)],
        tmp_path / "logs",
        ready_timeout_s=120,
        grace_s=10,
    )
    url = dep.start()
    try:
        pids = dep.pids()
        info = eng.info(url)
        assert info is not None and info["speculative_algorithm"] == "EAGLE"
        assert info["port"] == dep.plans[0].port
        metrics = eng.scrape(url)
        assert metrics is not None and any(
            k.startswith("vllm:spec_decode_num_drafts") for k in metrics
        )
    finally:
        dep.stop()
    import os

    assert not any(
        os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"
        for p in pids
    )
    assert port_free("127.0.0.1", dep.plans[0].port)
    assert "serve" in (tmp_path / "logs" / "0-server.log").read_text().splitlines()[0]
