"""SLO capacity in a real experiment over the scripted server (run/sweeps.py measures,
stats/capacity.py compares, report/ states): every stored sweep point re-judges to the stored
bracket, the report, its charts and `report --json` carry the effect, a failing server is a
failed run."""

from __future__ import annotations

import math

import pytest
from capacity_files import scripted_capacity

from servelab.bench.slo import parse_slo
from servelab.experiment.plan.preflight import load


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A real experiment: the scripted server with one slot (a FIFO queue), two arms, two
    blocks of one capacity sweep each."""
    from servelab.experiment.run.runner import Runner
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
    Runner(load(f), store, say=lambda s: None).run()
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
    from servelab.experiment.report.html import write

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

    from servelab.experiment.report.html import write

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

    f = Path(__file__).resolve().parents[3] / "examples" / "mtp_capacity.toml"
    s = load(f)  # validation and pre-flight (flags, the MTP recipe on 'embedded')
    assert s.load.keys() == [("capacity", None, None)] and set(s.arms) == {"baseline", "mtp"}
    assert parse_slo(s.load.sweep.slo).sample_note(s.workload.num_prompts) is None


def test_a_sweep_against_a_failing_server_is_a_failed_run_not_a_crash(tmp_path):
    import sys

    from servelab.experiment.run.runner import Runner
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
        res = Runner(load(f), store, say=lambda s: None).run()
        runs = {r.arm: r for r in store.runs("capf")}
    assert (res.ok, res.failed) == (1, 1)
    assert runs["broken"].status == "failed" and "completed no request" in runs["broken"].error
