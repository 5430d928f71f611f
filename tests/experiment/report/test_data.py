"""The report's own warnings (experiment/report/data.py): an A/A arm sizes the machine's noise,
runs pooled from different machines are flagged."""

from __future__ import annotations


def test_aa_arm_is_reported_as_the_machines_noise():
    import numpy as np

    from servelab.experiment.design.model import ArmSpec
    from servelab.experiment.report.data import aa_notes
    from servelab.experiment.stats.analysis import analyze
    from servelab.experiment.stats.runs import RunValue

    rng = np.random.default_rng(0)
    runs = [
        RunValue(arm, "c=1", b, b, {"output_throughput_tok_s": 100 * rng.lognormal(0, 0.01)})
        for b in range(6)
        for arm in ("a", "a2", "b")
    ]
    an = analyze(runs, baseline="a", arms=["a", "a2", "b"], load_keys=["c=1"])
    arms = {"a": ArmSpec(), "a2": ArmSpec(description="same"), "b": ArmSpec(flags={"x": 1})}
    notes = aa_notes(arms, an, "a", "output_throughput_tok_s")
    assert len(notes) == 1 and notes[0].startswith("A/A arm a2 (identical to a) at c=1")
    e = an.effects[("a2", "c=1", "output_throughput_tok_s")]
    half = max(abs(e.ci_low - 1), abs(e.ci_high - 1)) * 100
    assert f"+-{half:.1f}%" in notes[0]
    # an arm without a delta is no A/A arm when the baseline has one (cache off vs default on)
    arms = {"a": ArmSpec(flags={"disable-radix-cache": True}), "a2": ArmSpec(), "b": ArmSpec()}
    assert aa_notes(arms, an, "a", "output_throughput_tok_s") == []
    arms = {"a": ArmSpec(flags={"x": 1}), "a2": ArmSpec(flags={"x": 1}, description="again"),
            "b": ArmSpec()}
    assert [n[:27] for n in aa_notes(arms, an, "a", "output_throughput_tok_s")] == [
        "A/A arm a2 (identical to a)"]


def test_runs_from_different_machines_are_flagged():
    from servelab.experiment.report.data import mixed_provenance

    same = [{"host": "a", "gpus": None, "servelab_version": "0.1.0"}] * 3
    assert mixed_provenance(same) == []
    mixed = same + [{"host": "b", "gpus": [{"name": "H200"}], "servelab_version": "0.1.0"}]
    w = mixed_provenance(mixed)
    assert len(w) == 2 and "2 different hosts ('a', 'b')" in w[0] and "GPU sets" in w[1]
