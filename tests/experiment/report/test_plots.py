"""The report's plots (experiment/report/plots.py) as PNG bytes: one per chart, the acceptance
chart only when an arm reports an acceptance length, and a forest plot that stays readable
when a CI runs far beyond the clip (+1000%) or is open."""

from __future__ import annotations

import numpy as np

from servelab.experiment.report import plots
from servelab.experiment.stats.analysis import analyze
from servelab.experiment.stats.runs import RunValue

PNG = b"\x89PNG\r\n\x1a\n"


def _analysis(accept: bool, scale: float = 1.5):
    rng = np.random.default_rng(0)
    runs = []
    for b in range(4):
        for arm, f in (("base", 1.0), ("mtp", scale)):
            s = {"output_throughput_tok_s": 100 * f * rng.lognormal(0, 0.02),
                 "ttft_ms": {"median": 50.0}, "tpot_ms": {"median": 10 / f}}
            if accept:
                s["accept_length"] = 1.0 if arm == "base" else 2.5
            runs.append(RunValue(arm, "c=1", b, b, s))
    return analyze(runs, baseline="base", arms=["base", "mtp"], load_keys=["c=1"])


def test_every_chart_is_a_png():
    an = _analysis(accept=True)
    assert plots.throughput(an).startswith(PNG)
    assert plots.effects(an, ("output_throughput_tok_s", "tpot_ms")).startswith(PNG)
    acc = plots.acceptance(an)
    assert acc is not None and acc.startswith(PNG)
    box = plots.distributions({("base", "c=1"): [1.0, 2.0], ("mtp", "c=1"): []},
                              an.arms, an.load_keys, "TTFT (ms)")
    assert box.startswith(PNG)  # an arm without values is drawn empty, not an error


def test_no_acceptance_chart_without_an_acceptance_length():
    assert plots.acceptance(_analysis(accept=False)) is None


def test_a_ci_beyond_the_clip_still_draws():
    an = _analysis(accept=False, scale=40.0)  # +3900%: beyond CLIP_PCT
    e = an.effects[("mtp", "c=1", "output_throughput_tok_s")]
    assert e.pct(e.ci_high) > plots.CLIP_PCT
    assert plots.effects(an, ("output_throughput_tok_s",)).startswith(PNG)
