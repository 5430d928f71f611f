"""Noise control end to end: core pinning of the client and engines, blocks paused or repeated
for interference (and said so), and adaptive repetitions stopping."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servelab.experiment.design.model import ExperimentSpec
from servelab.experiment.plan.preflight import load
from servelab.experiment.report.data import collect
from servelab.experiment.report.markdown import markdown
from servelab.experiment.report.noise import stopping_lines
from servelab.experiment.run import pinning
from servelab.experiment.run.measure import bench_measure
from servelab.experiment.run.measurement import Measurement
from servelab.experiment.run.runner import Runner
from servelab.store import Store

BUSY = [sys.executable, "-c", "while True: pass"]


def _spec(tmp_path: Path, scripted, name: str, extra: str, **kw) -> ExperimentSpec:
    text, _ = scripted(name, extra=extra, **kw)
    if "repetitions" in extra:  # the extra lines set it: drop the template's own
        text = re.sub(r"(?m)^repetitions = \d+\n", "", text)
    f = tmp_path / f"{name}.toml"
    f.write_text(text)
    return load(f)


@pytest.mark.skipif(len(pinning.available()) < 2, reason="pinning needs 2 usable cores")
def test_client_and_engines_run_on_the_cores_the_plan_gives(tmp_path, scripted, live_procs):
    spec = _spec(
        tmp_path, scripted, "pin", "[noise]\npin = true\n", reps=1, loads="[2]", restart="block"
    )
    seen: list[tuple[str, list[int] | None, list[list[int] | None]]] = []

    def measure(url, spec, run) -> Measurement:
        # while measuring: the client (this process) and every process of the deployments
        dep_pids = [p for d in runner._active for p in d.pids()]
        seen.append(
            (run.arm, pinning.affinity(os.getpid()), [pinning.affinity(p) for p in dep_pids])
        )
        return bench_measure(url, spec, run)

    with Store(tmp_path / "r.db") as store:
        runner = Runner(spec, store, measure=measure, say=lambda s: None)
        mask_before = pinning.available()
        runner.run()
        plan = runner.pins
        assert plan.active and plan.client == (mask_before[0],)
        for arm, client, engines in seen:
            assert client == list(plan.client)
            assert engines and all(e == list(plan.engines[arm]) for e in engines)
        assert pinning.available() == mask_before  # the runner gives its cores back
        lp = store.load_point(store.runs("pin")[0].load_point_id)
        rec = lp.provenance["pinning"]
        assert rec["client_actual"] == list(plan.client)
        assert rec["engine_actual"] == rec["engines"][store.runs("pin")[0].arm]
        assert lp.provenance["interference"]["other_cpu_cores"] is not None


def test_a_disturbed_block_is_repeated_kept_in_the_store_and_reported(tmp_path, scripted):
    # a busy loop of another process crosses the threshold in block 0 only
    spec = _spec(
        tmp_path,
        scripted,
        "rep",
        '[noise]\nmax_other_cpu = 0.4\non_interference = "repeat"\nmax_repeats = 1\n',
        reps=2,
        loads="[2]",
        restart="block",
    )
    busy: list[subprocess.Popen] = []

    def measure(url, spec, run) -> Measurement:
        if run.block == 0 and not busy:
            busy.append(subprocess.Popen(BUSY))
            time.sleep(0.3)
        if run.block == 1 and busy:
            busy.pop().kill()
        m = bench_measure(url, spec, run)
        if run.block == 0:
            time.sleep(1.0)  # long enough for the busy loop to show in the record
        return m

    with Store(tmp_path / "r.db") as store:
        lines: list[str] = []
        try:
            Runner(spec, store, measure=measure, say=lines.append).run()
        finally:
            for p in busy:
                p.kill()
        runs = store.runs("rep")
        assert sorted({r.block for r in runs}) == [0, 1, 2]  # one extra block for the repeat
        data = collect(store, "rep")
        assert data.excluded == [0] and 0 in data.flagged
        # block 0 is stored but left out: the effects rest on blocks 1 and 2
        assert data.analysis.effects[("fast", "c=2", "output_throughput_tok_s")].n == 2
        text = "\n".join(stopping_lines(data))
        assert "interference in block 1" in text and "repeated: left out" in text
        assert "interference in block 1" in markdown(data)
        assert any("interference:" in x for x in lines)


def test_pause_waits_for_a_quiet_machine_and_records_the_wait(tmp_path, scripted):
    spec = _spec(
        tmp_path,
        scripted,
        "pause",
        '[noise]\nmax_other_cpu = 0.4\non_interference = "pause"\npause_s = 3\n',
        reps=1,
        loads="[2]",
        restart="block",
    )
    p = subprocess.Popen(BUSY)  # busy for the whole wait: the runner waits pause_s, then goes on
    try:
        with Store(tmp_path / "r.db") as store:
            lines: list[str] = []
            Runner(spec, store, say=lines.append).run()
            data = collect(store, "pause")
    finally:
        p.kill()
        p.wait()
    assert any(x.startswith("pausing: ") for x in lines)  # plain text: no markup
    first = min(data.runs, key=lambda r: r.seq)
    inter = data.load_points[first.load_point_id].provenance["interference"]
    assert inter["paused_s"] >= 3 and "still so after the wait" in inter["pause_reason"]
    assert any(x.startswith("paused ") for x in stopping_lines(data))


def test_adaptive_repetitions_stop_when_every_effect_is_decided(tmp_path, scripted):
    spec = _spec(
        tmp_path,
        scripted,
        "auto",
        'repetitions = "auto"\n[adaptive]\nmin = 3\nmax = 10\nbudget_s = 600\n',
        loads="[1, 2]",
        restart="block",
        gap_ms=8.0,
    )
    with Store(tmp_path / "r.db") as store:
        lines: list[str] = []
        Runner(spec, store, say=lines.append).run()
        data = collect(store, "auto")
    blocks = {r.block for r in data.runs}
    # two tokens per chunk halve the time per token: decided at the first look or soon after
    assert 3 <= len(blocks) < 10, lines
    assert any("every primary effect decided" in x for x in lines)
    decided = []
    for lk in ("c=1", "c=2"):
        e = data.analysis.effects[("fast", lk, "output_throughput_tok_s")]
        assert e.rule == "sequential" and e.verdict == "better" and e.n == len(blocks)
        decided.append(e.decided_at)
    assert max(decided) == len(blocks)  # it stopped at the look that decided the last effect
    text = "\n".join(stopping_lines(data))
    assert "every primary effect decided" in text and "measured error rate" in text


def test_adaptive_budget_stops_and_names_the_undecided(tmp_path, scripted):
    # an A/A design with a tiny budget: nothing can be decided before it is spent
    spec = _spec(
        tmp_path,
        scripted,
        "budget",
        'repetitions = "auto"\n[adaptive]\nmin = 3\nmax = 8\nbudget_s = 1\n',
        loads="[2]",
        restart="block",
        arms="[arms.slow]\n[arms.again]\n",
    )
    with Store(tmp_path / "r.db") as store:
        lines: list[str] = []
        Runner(spec, store, say=lines.append).run()
        data = collect(store, "budget")
    assert {r.block for r in data.runs} == {0}  # the first block always runs
    assert any("time budget of 1 s spent" in x and "again at c=2" in x for x in lines)
    assert "left undecided" in "\n".join(stopping_lines(data))


def test_repeat_mode_runs_no_extra_block_when_nothing_was_disturbed(tmp_path, scripted):
    spec = _spec(
        tmp_path,
        scripted,
        "calm",
        '[noise]\nmax_other_cpu = 1000\non_interference = "repeat"\nmax_repeats = 2\n',
        reps=2,
        loads="[2]",
        restart="block",
    )
    with Store(tmp_path / "r.db") as store:
        lines: list[str] = []
        Runner(spec, store, say=lines.append).run()
        assert {r.block for r in store.runs("calm")} == {0, 1}  # the plan held 4 blocks
        assert any("all 2 blocks measured (0 disturbed" in x for x in lines)
