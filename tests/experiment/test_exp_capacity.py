"""SLO capacity as an experiment metric (experiment/capacity.py): the interval-arithmetic effect
against hand-computed bounds, honest open brackets, the `[load.sweep]` schema, and a real
experiment over the scripted server whose stored sweep points re-judge to the stored bracket."""

from __future__ import annotations

import math

import pytest
from capacity_files import scripted_capacity

from servelab.bench.slo import parse_slo
from servelab.errors import UserError
from servelab.experiment import capacity
from servelab.experiment import spec as spec_mod
from servelab.experiment.stats import RunValue


def _run(arm: str, block: int, status: str, lo: float | None, hi: float | None,
         sync: float = 1.0) -> RunValue:
    cap = {"status": status, "low_req_s": lo, "high_req_s": hi, "synchronous_req_s": sync,
           "slo_text": "ttft_p99_ms <= 2000"}
    return RunValue(arm, "capacity", block, block, {"capacity": cap})


def test_closed_brackets_give_the_interval_arithmetic_bounds():
    # identical blocks: every bootstrap resample is the same, so the CI is exactly the bounds
    # a_low / b_high and a_high / b_low, and the point the ratio of the bracket midpoints
    runs = [r for b in range(6) for r in (_run("base", b, "bracketed", 10.0, 11.0),
                                          _run("mtp", b, "bracketed", 20.0, 22.0))]
    e = capacity.compare(runs, "mtp", "base", 0.02, "capacity")
    assert e.n == 6 and e.open_blocks == 0
    assert e.ci_low == pytest.approx(20 / 11) and e.ci_high == pytest.approx(22 / 10)
    assert e.ratio == pytest.approx(math.sqrt(20 * 22) / math.sqrt(10 * 11))
    assert e.verdict == "better"
    assert e.sentence() == ("mtp raises SLO capacity under ttft_p99_ms <= 2000 by +100% "
                            "[+82%, +120%] (vs base)")


def test_noise_between_blocks_widens_the_interval_beyond_the_brackets():
    import numpy as np

    rng = np.random.default_rng(1)
    runs = []
    for b in range(8):
        s = float(rng.lognormal(0, 0.1))
        runs += [_run("base", b, "bracketed", 10.0, 10.5), _run("x", b, "bracketed", 12 * s, 12.6 * s)]
    e = capacity.compare(runs, "x", "base", 0.02, "capacity")
    assert e.ci_low < 12 / 10.5 * 0.97 and e.ci_high > 12.6 / 10 * 1.03
    assert e.ci_low < e.ratio < e.ci_high


def test_open_brackets_are_bounds_not_numbers():
    runs = [r for b in range(5) for r in (_run("base", b, "bracketed", 10.0, 11.0),
                                          _run("fast", b, "above_saturation", 30.0, None),
                                          _run("broken", b, "unmet_at_synchronous", 0.0, None, 2.0))]
    up = capacity.compare(runs, "fast", "base", 0.02, "capacity")
    assert math.isnan(up.ratio) and math.isinf(up.ci_high) and up.open_blocks == 5
    assert up.ci_low == pytest.approx(30 / 11) and up.verdict == "better"
    assert up.pct_text() == "[+173%, +inf]"
    assert up.sentence().startswith("fast raises SLO capacity under ttft_p99_ms <= 2000 by at "
                                    "least 173% (95% CI [+173%, +inf]; 5 of 5 blocks")
    down = capacity.compare(runs, "broken", "base", 0.02, "capacity")
    assert down.ci_low == 0.0 and down.ci_high == pytest.approx(2.0 / 10) and down.verdict == "worse"
    assert capacity.bracket_of(runs[1].summary).text() == ">= 30"
    assert capacity.bracket_of(runs[2].summary).text() == "< 2"
    # an open upper end that may fall below the band: the effect is not decided
    mixed = [r for b in range(5) for r in (_run("base", b, "bracketed", 10.0, 11.0),
                                           _run("m", b, "unresolved", None, 12.0))]
    assert capacity.compare(mixed, "m", "base", 0.02, "capacity").verdict == "inconclusive"


def test_same_capacity_is_within_noise_and_one_block_too_few():
    runs = [r for b in range(5) for r in (_run("a", b, "bracketed", 10.0, 10.05),
                                          _run("b", b, "bracketed", 10.0, 10.05))]
    assert capacity.compare(runs, "b", "a", 0.02, "capacity").verdict == "within noise"
    one = [_run("a", 0, "bracketed", 10.0, 11.0), _run("b", 0, "bracketed", 20.0, 22.0)]
    assert capacity.compare(one, "b", "a", 0.02, "capacity").verdict == "too few runs"


def _spec(load: str) -> dict:
    import tomllib

    return tomllib.loads(f"""
name = "x"
engine = "external"
url = "http://127.0.0.1:1"
[arms.a]
[arms.b]
[load]
{load}
""")


def test_sweep_spec_is_validated_in_one_line():
    s = spec_mod.parse(_spec('sweep = { slo = "ttft_p99_ms=2000", precision = 0.05 }'))
    assert s.load.keys() == [("capacity", None, None)] and s.load.sweep.precision == 0.05
    with pytest.raises(UserError, match=r"^<experiment>: load\.sweep\.slo: .*not an SLO"):
        spec_mod.parse(_spec('sweep = { slo = "latency=5" }'))
    with pytest.raises(UserError, match=r"load\.sweep: .*max_points 4 leaves no room"):
        spec_mod.parse(_spec('sweep = { slo = "ttft:500", rates = 3, max_points = 4 }'))
    with pytest.raises(UserError, match="sweep = "):
        spec_mod.parse(_spec("burstiness = 1.0"))


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A real experiment: the scripted server with one slot (a FIFO queue), two arms, two
    blocks of one capacity sweep each."""
    from servelab.experiment.runner import Runner
    from servelab.store import Store

    tmp = tmp_path_factory.mktemp("cap")
    text = scripted_capacity("capx", """
hypothesis = "two tokens per chunk raise the SLO capacity"
repetitions = 2
restart = "arm"
""")
    f = tmp / "capx.toml"
    f.write_text(text)
    store = Store(tmp / "r.db")
    Runner(spec_mod.load(f), store, say=lambda s: None).run()
    return store, tmp


def test_every_sweep_point_is_stored_and_rejudges_to_the_bracket(swept):
    store, _ = swept
    slo = parse_slo("ttft_p90_ms=40")
    runs = [r for r in store.runs("capx") if r.status == "ok"]
    assert len(runs) == 4 and {r.load_key for r in runs} == {"capacity"}
    for r in runs:
        lp = store.load_point(r.load_point_id)
        cap = lp.summary["capacity"]
        pts = [lp] + [store.load_point(i) for i in lp.summary["sweep_point_ids"]]
        assert len(pts) >= 3  # synchronous, saturated, grid (+ refinements)
        for p in pts:  # ordinary load points: summary, load key, per-request records
            assert p.source == "experiment" and p.load_key == p.summary["load_key"]
            assert sum(1 for _ in store.requests(p)) == p.summary["issued"]
        # the SLO verdict of each stored point, recomputed, gives the stored bracket
        judged = [(p.request_rate, slo.check(p.summary).met) for p in pts
                  if p.request_rate is not None and math.isfinite(p.request_rate)]
        from servelab.bench.sweep import first_crossing

        lo, hi, _ = first_crossing(judged)
        if cap["status"] == "unmet_at_synchronous":  # the noisy machine missed at c=1
            assert lp.concurrency == 1 and not slo.check(lp.summary).met
            continue
        if cap["status"] == "none_met":
            lo = 0.0  # "none" is reported as 0, first_crossing's None
        assert (lo, hi) == (cap["low_req_s"], cap["high_req_s"]), (cap, judged)
        if lo is not None:  # the run's own point is the one at capacity
            assert lp.request_rate == cap["low_req_s"]


def test_report_states_the_capacity_effect(swept):
    from servelab.experiment.report import write

    store, tmp = swept
    md, page, _ = write(store, "capx", tmp / "out")
    text = md.read_text()
    assert "## Capacity under SLOs" in text
    assert "SLO capacity under ttft_p90_ms <= 40" in text
    assert "- Suggested by the verdicts: " in text and "- Decision: (to fill in" in text
    doc = page.read_text()
    assert "uPlot" in doc and 'id="tradeoff-data"' not in doc and "id='tradeoff-data'" in doc


CHROMIUM = __import__("shutil").which("chromium") or __import__("shutil").which("chromium-browser")


def _chromium(tmp, url: str, *args: str) -> str:
    import subprocess

    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update",
             f"--user-data-dir={tmp / 'chr'}", "--virtual-time-budget=5000", *args, url]
    return subprocess.run(flags, capture_output=True, text=True, timeout=120).stdout


def _blue_pixels(png) -> int:
    """Pixels of the first arm's colour (#1f77b4) in a screenshot."""
    import matplotlib.image as mpimg
    import numpy as np

    px = (mpimg.imread(png)[..., :3] * 255).astype(int)
    return int((np.abs(px - np.array([31, 119, 180])).sum(axis=-1) < 40).sum())


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (scripts/ensure-chromium)")
def test_trade_off_charts_render_and_toggle_in_chromium(swept):
    """The curves are drawn (canvas pixels of the arm's colour), the SLO line sits at its
    limit, and the checkboxes hide series on every chart."""
    import re

    from servelab.experiment.report import write

    store, tmp = swept
    _, page, _ = write(store, "capx", tmp / "out")
    dom = _chromium(tmp, page.as_uri(), "--dump-dom")
    assert 'data-charts-rendered="4/4"' in dom, dom[:300]
    # 2 arms x (p50, p95, p99 curves + p50 dots) on each latency chart; dots + Pareto front per
    # arm on the last
    assert re.findall(r'data-visible-series="(\d+)"', dom) == ["8", "8", "8", "4"]
    hidden = _chromium(tmp, page.as_uri() + "#toggle=stat:p99,arm:fast", "--dump-dom")
    assert re.findall(r'data-visible-series="(\d+)"', hidden) == ["3", "3", "3", "2"]
    shots = {}
    for name, frag in (("all", ""), ("no_slow", "#toggle=arm:slow")):
        shots[name] = tmp / f"{name}.png"
        _chromium(tmp, page.as_uri() + frag, "--window-size=1150,1800",
                  f"--screenshot={shots[name]}")
    shown, gone = _blue_pixels(shots["all"]), _blue_pixels(shots["no_slow"])
    assert shown > 1500, shown  # the slow arm's curves and points are drawn
    assert gone < 0.25 * shown, (gone, shown)  # and hidden by its checkbox


def test_report_json_carries_the_capacity_effect(swept, monkeypatch, capsys):
    import json
    import sys

    from servelab.cli import main

    store, tmp = swept
    monkeypatch.setattr(sys, "argv", ["servelab", "report", "capx", "--store", str(store.path),
                                      "--out", str(tmp / "j"), "--json"])
    try:
        main()
    except SystemExit as e:
        assert not e.code
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "servelab.experiment/1" and doc["report"]["html"].endswith("report.html")
    (eff,) = doc["capacity"]["effects"]
    assert eff["arm"] == "fast" and eff["n"] == 2
    assert eff["sentence"].startswith("fast") and "ttft_p90_ms <= 40" in eff["sentence"]
    brackets = {a["arm"]: a["brackets"] for a in doc["capacity"]["arms"]}
    stored = [store.load_point(r.load_point_id).summary["capacity"]["low_req_s"]
              for r in store.runs("capx") if r.arm == "slow"]
    assert sorted(b["low_req_s"] for b in brackets["slow"]) == sorted(x or 0.0 for x in stored)


def test_mtp_capacity_example_is_valid():
    from pathlib import Path

    f = Path(__file__).resolve().parents[2] / "examples" / "mtp_capacity.toml"
    s = spec_mod.load(f)  # validation and pre-flight (flags, the MTP recipe on 'embedded')
    assert s.load.keys() == [("capacity", None, None)] and set(s.arms) == {"baseline", "mtp"}
    assert parse_slo(s.load.sweep.slo).sample_note(s.workload.num_prompts) is None


def test_a_sweep_against_a_failing_server_is_a_failed_run_not_a_crash(tmp_path):
    import sys

    from servelab.experiment.runner import Runner
    from servelab.store import Store

    f = tmp_path / "capf.toml"
    f.write_text(f"""
name = "capf"
engine = "command"
command = ["{sys.executable}", "-m", "servelab.bench.scripted", "--host", "{{host}}",
           "--port", "{{port}}", "--model", "capf", "--no-log"]
repetitions = 1
[base.flags]
ttft-ms = 2
gap-ms = 1
[arms.ok]
[arms.broken]
flags = {{ fail-rate = 1.0 }}
[load]
sweep = {{ slo = "ttft_p90_ms=500", precision = 0.5, rates = 0, max_points = 4 }}
[workload]
input_len = 4
output_len = 3
num_prompts = 4
[timeouts]
ready_s = 30
teardown_s = 5
""")
    with Store(tmp_path / "r.db") as store:
        res = Runner(spec_mod.load(f), store, say=lambda s: None).run()
        runs = {r.arm: r for r in store.runs("capf")}
    assert (res.ok, res.failed) == (1, 1)
    assert runs["broken"].status == "failed" and "completed no request" in runs["broken"].error
