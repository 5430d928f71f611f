"""A multi-turn experiment end to end: `[workload.sessions]` runs every arm as sessions in
flight, each run stores its TTFT by turn index, and the report shows it per arm as the median
over runs of what the runs stored (never recomputed from requests)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from servelab.experiment.plan.preflight import load
from servelab.experiment.report.html import write
from servelab.experiment.run.runner import Runner
from servelab.store import Store


def test_report_shows_ttft_by_turn_index_per_arm(tmp_path, scripted):
    text, _ = scripted("turns", reps=2, loads="[2]", prompts=4)
    text += "\n[workload.sessions]\nnum_sessions = 3\nturns = 3\nthink_time = \"0.01\"\n"
    f = tmp_path / "turns.toml"
    f.write_text(text)
    store = Store(tmp_path / "r.db")
    Runner(load(f), store, say=lambda s: None).run()
    md, page, _ = write(store, "turns", tmp_path / "out")
    section = md.read_text().split("## TTFT by turn index", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in x.strip("|").split("|")] for x in section.splitlines()
            if x.startswith("| slow") or x.startswith("| fast")]
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        (arm, "c=2", str(t), "2") for arm in ("slow", "fast") for t in (1, 2, 3)]
    for arm, _, turn, _, med, p90, inp in rows:
        stored = [row for r in store.runs("turns") if r.arm == arm
                  for row in store.load_point(r.load_point_id).summary["by_turn"]
                  if row["turn"] == int(turn)]
        assert len(stored) == 2
        assert med == f"{np.median([x['ttft_ms']['median'] for x in stored]):.4g}"
        assert p90 == f"{np.median([x['ttft_ms']['p90'] for x in stored]):.4g}"
        # the history grows: turn k sends k x 8 new tokens and k-1 answers of 9
        assert inp == f"{8 * int(turn) + 9 * (int(turn) - 1)}"
    assert "<h2>TTFT by turn index</h2>" in page.read_text()


def test_the_multiturn_example_loads_with_its_sessions():
    spec = load(Path(__file__).resolve().parents[3] / "examples" / "multiturn.toml")
    ss = spec.workload.sessions
    assert ss is not None and (ss.num_sessions, ss.turns) == (4, 4)
    assert [k for k, _, _ in spec.load.keys()] == ["c=2"]
