"""The runner pairs a block's capacity sweeps point by point only when every arm is up at once
(restart = "block") and `[load.sweep] paired` is on (the pairing itself: run/test_sweeps.py)."""

from __future__ import annotations

import tomllib

import pytest
from capacity_files import scripted_capacity

from servelab.experiment.design.parse import parse
from servelab.experiment.run import sweeps

SLO = "ttft_p90_ms=40"
SWEEP = f'slo = "{SLO}", precision = 0.5, rates = 1, max_points = 8'


def _file(restart: str = "block", paired: str = "true") -> str:
    return scripted_capacity("capp", f'repetitions = 1\nrestart = "{restart}"',
                             f"{SWEEP}, paired = {paired}")


@pytest.mark.parametrize(("restart", "paired", "expect_pairs"),
                         [("block", "true", True), ("block", "false", False),
                          ("arm", "true", False)])
def test_the_runner_pairs_only_when_every_arm_is_up(tmp_path, restart, paired, expect_pairs):
    """Through the Runner with real deployments (scripted servers launched by the `command`
    engine): the measuring function sees both arms at once only with restart = "block" and
    paired on; otherwise each sweep is measured alone."""
    from servelab.experiment.run.runner import Runner
    from servelab.store import Store

    spec = parse(tomllib.loads(_file(restart, paired)))
    groups: list[list[str]] = []

    def paired_fn(items, on_point):
        groups.append([run.arm for _, _, run in items])
        return sweeps.measure_paired(items, on_point)

    def single(url, s, run):
        groups.append([run.arm])
        return sweeps.measure(url, s, run)

    from servelab.experiment.report.html import write

    with Store(tmp_path / "r.db") as store:
        res = Runner(spec, store, measure=single, measure_paired=paired_fn,
                     say=lambda s: None, log_root=tmp_path / "logs").run()
        runs = list(store.runs("capp"))
        caps = [store.load_point(r.load_point_id).summary["capacity"] for r in runs]
        md = write(store, "capp", tmp_path / "report")[0].read_text()
    assert (res.ok, res.failed) == (2, 0)
    if expect_pairs:
        assert len(groups) == 1 and sorted(groups[0]) == ["fast", "slow"]
        assert all(c.get("paired_with") for c in caps)
        assert md.count("1 paired point by point)") == 2  # each arm's capacity says so
    else:
        assert sorted(map(tuple, groups)) == [("fast",), ("slow",)]
        assert not any(c.get("paired_with") for c in caps)
        assert "paired point by point" not in md
