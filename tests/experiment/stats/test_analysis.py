"""The analysis of an experiment (experiment/stats/analysis.py): spreads, effects and warnings."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servelab.experiment.stats import analysis as st
from servelab.experiment.stats.runs import RunValue


def test_analyze_spreads_effects_and_warnings():
    rng = np.random.default_rng(8)
    runs = []
    for b in range(3):
        drift = 1 + 0.01 * b
        for arm, tput, acc in (("base", 100.0, None), ("mtp", 147.0, 1.8), ("mtp2", 150.0, 2.4)):
            for lk, scale, noise in (("c=1", 1.0, 0.005), ("c=16", 8.0, 0.3)):
                s = {
                    "output_throughput_tok_s": tput * scale * drift * rng.lognormal(0, noise),
                    "ttft_ms": {"median": 20.0 * drift},
                    "tpot_ms": None,
                    "accept_length": acc,
                }
                runs.append(RunValue(arm, lk, b, b, s))
    an = st.analyze(runs, baseline="base", arms=["base", "mtp", "mtp2"], load_keys=["c=1", "c=16"])
    vals = [
        r.summary["output_throughput_tok_s"] for r in runs if r.arm == "mtp" and r.load_key == "c=1"
    ]
    sp = an.spreads[("mtp", "c=1", "output_throughput_tok_s")]
    assert sp.median == pytest.approx(float(np.median(vals)))
    assert sp.cv == pytest.approx(float(np.std(vals, ddof=1) / np.mean(vals)))
    assert math.isnan(an.spreads[("base", "c=1", "tpot_ms")].median)  # missing stays NaN
    e = an.effects[("mtp", "c=1", "output_throughput_tok_s")]
    assert e.paired and e.n == 3 and e.verdict == "better" and 1.40 < e.ratio < 1.55
    assert an.effects[("mtp", "c=1", "ttft_ms")].verdict == "within noise"
    text = "\n".join(an.warnings)
    assert "only 3 repetition(s)" in text
    assert "CV between runs" in text and "c=16" in text  # the noisy load point is flagged
    assert "acceptance length differs" in text and "mtp2" in text
    line = st.headline(an, "output_throughput_tok_s")[0]
    assert line.startswith("mtp vs base") and "at c=1 (better)" in line


def test_failed_requests_inside_ok_runs_are_warned():
    runs = [
        RunValue(
            arm,
            "c=2",
            b,
            b,
            {
                "output_throughput_tok_s": 10.0 + b,
                "completed": 6,
                "failed": 2 if (arm, b) == ("x", 1) else 0,
            },
        )
        for b in range(5)
        for arm in ("base", "x")
    ]
    an = st.analyze(runs, baseline="base", arms=["base", "x"], load_keys=["c=2"])
    assert [w for w in an.warnings if "requests failed" in w] == [
        "arm x at c=2: 2 of 32 requests failed in its ok runs; see the runs' failure_reasons "
        "(servelab results show ID)"
    ]
    assert not any("repetition(s)" in w for w in an.warnings)  # 5 repetitions are enough


def test_spread_keeps_every_run_value_and_drops_nan():
    s = st.spread("a", "c=1", "ttft_ms", [3.0, float("nan"), 1.0, 2.0])
    assert s.values == (3.0, 1.0, 2.0) and s.n == 3 and s.median == 2.0
    assert (s.min, s.max) == (1.0, 3.0) and s.std == pytest.approx(1.0)
