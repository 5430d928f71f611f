"""SLO capacity under adaptive repetitions end to end: the runner stops right after the block at
which the capacity effect is decided, and `report --json` states that same always-valid
interval (the statistics themselves: stats/test_capacity_adaptive.py)."""

from __future__ import annotations

import pytest


def test_adaptive_experiment_stops_when_its_capacity_effect_is_decided(tmp_path, monkeypatch,
                                                                        capsys):
    """A real adaptive experiment (scripted servers, one capacity sweep per run): the runner
    stops right after the block at which the capacity effect is decided (or runs to the
    maximum when it never is), and `report --json` states that same always-valid interval."""
    import json
    import sys

    from capacity_files import scripted_capacity

    from servelab.cli import main
    from servelab.experiment.plan.preflight import load
    from servelab.experiment.run.runner import Runner
    from servelab.experiment.stats import evidence
    from servelab.store import Store

    f = tmp_path / "capa.toml"
    f.write_text(scripted_capacity("capa", """
repetitions = "auto"
restart = "block"
noise_band = 0.05
[adaptive]
min = 3
max = 5
budget_s = 300
"""))
    said: list[str] = []
    store = Store(tmp_path / "r.db")
    Runner(load(f), store, say=said.append).run()
    ev = evidence.gather(store, "capa")
    e = ev.analysis.capacity["fast"]
    assert e.rule == "sequential" and e.n == ev.blocks_used
    if e.verdict == "undecided":
        assert ev.blocks_used == 5 and any("maximum of 5 blocks" in s for s in said), said
    else:  # decided at a look: no block after it
        assert ev.blocks_used == e.decided_at >= 3, (e, said)
        assert any("every primary effect decided" in s for s in said), said
    monkeypatch.setattr(sys, "argv", ["servelab", "report", "capa", "--store", str(store.path),
                                      "--out", str(tmp_path / "rep"), "--json"])
    try:
        main()
    except SystemExit as exc:
        assert not exc.code
    out = json.loads(capsys.readouterr().out)["capacity"]
    (doc,) = out["effects"]
    assert (doc["rule"], doc["verdict"], doc["decided_at"]) == (e.rule, e.verdict, e.decided_at)
    # restart = "block": every block's two sweeps ran alternating point by point
    assert [a["paired_sweeps"] for a in out["arms"]] == [ev.blocks_used] * 2
    assert doc["ci_low"] == pytest.approx(e.ci_low) and doc["n"] == e.n
