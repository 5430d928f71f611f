"""Reports end to end: markdown + one self-contained HTML rendered by a real headless Chromium,
the noise band override, damaged request files, `report --out`."""

from __future__ import annotations

import base64
import math
import re
import shutil
import subprocess

import pytest
from fake_nvml import FakeNVML

from servelab.errors import UserError
from servelab.experiment.plan.preflight import load
from servelab.experiment.report.html import write
from servelab.experiment.run.runner import Runner
from servelab.store import Store
from servelab.telemetry import gpu as gpu_telemetry

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class OneGpu(FakeNVML):
    """The stand-in NVML's GPU 0 alone (300 W by its energy counter, power-capped and hot),
    running no process of anyone's: the machine of a run with GPU telemetry."""

    def __init__(self) -> None:
        super().__init__(count=1)

    def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
        return []


def _finished(tmp_path, scripted, reps: int, monkeypatch=None) -> Store:
    """A finished experiment over the scripted server; with `monkeypatch`, its load points
    sample the stand-in GPU (the library boundary of telemetry/gpu.py) as on a GPU machine."""
    if monkeypatch is not None:
        monkeypatch.setattr(gpu_telemetry, "_load_nvml", OneGpu)
    text, _ = scripted("rep", reps=reps, loads="[1, 2]", prompts=4)
    f = tmp_path / "rep.toml"
    f.write_text(text)
    store = Store(tmp_path / "r.db")
    Runner(load(f), store, say=lambda s: None).run()
    return store


@pytest.fixture
def finished(tmp_path, scripted, monkeypatch):
    return _finished(tmp_path, scripted, reps=2, monkeypatch=monkeypatch)


@pytest.fixture
def finished3(tmp_path, scripted):
    # 3 blocks: with 2 the Student-t floor (t_1 = 12.7) makes 'better' hang on two ratios
    # agreeing closely, which a loaded machine does not always give
    return _finished(tmp_path, scripted, reps=3)


def test_markdown_and_html_contents(finished, tmp_path):
    md, page, data = write(finished, "rep", tmp_path / "out")
    text = md.read_text()
    assert "| fast | c=1 | 2 |" in text and "(baseline)" in text
    assert "Hypothesis: two tokens per chunk halve TPOT" in text
    assert "Decision: (to fill in" in text
    # every metric's median over runs with its spread, recomputed from the stored summaries
    tpot = sorted(
        finished.load_point(r.load_point_id).summary["tpot_ms"]["median"]
        for r in finished.runs("rep")
        if (r.arm, r.load_key) == ("fast", "c=1")
    )
    section = text.split("## Medians over runs", 1)[1].split("\n## ", 1)[0]
    row = next(x for x in section.splitlines() if x.startswith("| fast | c=1 | 2 | "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    want = f"{(tpot[0] + tpot[1]) / 2:.4g} [{tpot[0]:.4g}-{tpot[1]:.4g}, CV "
    assert cells[6].startswith(want), (cells[6], want)
    doc = page.read_text()
    imgs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', doc)
    assert len(imgs) >= 4  # throughput, TTFT, TPOT, effects (+acc)
    assert all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in imgs)
    assert not re.search(r'(src|href)="(https?:)?//', doc)  # self-contained: nothing fetched
    # provenance of every run: each run's seq and its command line appear
    assert doc.count("<details>") == len(finished.runs("rep")) == 8
    assert "servelab.bench.scripted" in doc


@pytest.mark.skipif(
    CHROMIUM is None, reason="Debian chromium is not installed (scripts/ensure-chromium)"
)
def test_html_renders_in_headless_chromium(finished, tmp_path):
    _, page, _ = write(finished, "rep", tmp_path / "out")
    n_imgs = page.read_text().count('class="plot"')
    flags = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chr'}",
        "--virtual-time-budget=5000",
    ]
    dom = subprocess.run(
        [*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    # the page's own script counted images that decoded with a non-zero natural width
    assert f'data-plots-loaded="{n_imgs}/{n_imgs}"' in dom, dom[:500]
    assert "Attribution" in dom and "Decision record" in dom
    # the time-series panel: per load point tok/s, queue, SM clock, power (no KV usage served),
    # both arms drawn from their stored series; no script error hid anything
    assert 'data-timeseries-rendered="2 panels, 8 charts"' in dom, dom[:500]
    drawn = re.findall(r'data-quantity="(\w+)" data-points="slow:(\d+),fast:(\d+)"', dom)
    assert len(drawn) == 8 and all(int(a) > 0 and int(b) > 0 for _, a, b in drawn), drawn
    assert 'data-charts-rendered="4/4"' in dom
    assert re.findall(r'data-load="([^"]+)" data-block="([^"]+)"', dom) == [
        ("c=1", "block 1"), ("c=2", "block 1")]
    picked = subprocess.run([*flags, "--dump-dom", page.as_uri() + "#block=1:1"],
                            capture_output=True, text=True, timeout=120).stdout
    assert re.findall(r'data-load="([^"]+)" data-block="([^"]+)"', picked) == [
        ("c=1", "block 1"), ("c=2", "block 2")]  # the selector switched the second panel
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*flags, "--window-size=1000,1400", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        timeout=120,
    )
    import matplotlib.image as mpimg

    px = mpimg.imread(shot)
    assert px.shape[0] == 1400 and px.shape[1] == 1000
    assert px[..., :3].std() > 0.05  # not a blank page


def _panel(page) -> dict:
    import json

    doc = page.read_text()
    m = re.search(r"id='timeseries-data'>(.*?)</script>", doc, re.S)
    assert m, "no time-series data in the page"
    return json.loads(m.group(1).replace("<\\/", "</"))


def test_time_series_panel_and_energy_from_the_stored_side_files(finished, tmp_path):
    """The panel carries each run's series as stored beside its load point (rates of the
    generated-token counter, the queue, the stand-in GPU's 1980 MHz and 300 W), the energy
    fields are the GPU's joules over the load per output token, and the throttling is named."""
    md, page, data = write(finished, "rep", tmp_path / "out")
    pan = _panel(page)
    assert [p["load_key"] for p in pan["panels"]] == ["c=1", "c=2"]
    for p in pan["panels"]:
        assert p["shown"] == ["gen_tok_s", "queued_requests", "sm_clock_mhz", "power_w"]
        assert any("KV-cache usage: not measured" in n for n in p["notes"])  # not served
        assert [b["label"] for b in p["blocks"]] == ["block 1", "block 2"]
    by = {(p["load_key"], b["label"], arm): q for p in pan["panels"] for b in p["blocks"]
          for arm, q in b["runs"].items()}
    runs = [r for r in finished.runs("rep") if r.status == "ok"]
    assert len(by) == len(runs) == 8
    for r in runs:
        lp = finished.load_point(r.load_point_id)
        tel, got = finished.telemetry(lp), by[(r.load_key, f"block {r.block + 1}", r.arm)]
        t0, ts = tel["load_start_s"], tel["server"]["t_s"]
        gen = tel["server"]["series"]["generation_tokens"]
        rates = [(b - a) / (tb - ta) for a, b, ta, tb in zip(gen, gen[1:], ts, ts[1:], strict=False)]
        assert got["gen_tok_s"][1] == pytest.approx(rates, rel=1e-3)
        assert got["queued_requests"][1] == tel["server"]["series"]["queued_requests"]
        assert got["queued_requests"][0] == pytest.approx([t - t0 for t in ts], abs=1e-5)
        assert set(got["power_w"][1]) == {300.0} and set(got["sm_clock_mhz"][1]) == {1980.0}
        s = lp.summary
        assert s["j_per_output_token"] == pytest.approx(s["energy"]["joules"]
                                                        / s["total_output_tokens"])
        assert s["energy"]["source"] == "counter"
        assert s["energy"]["mean_power_w"] == pytest.approx(300.0, rel=0.05)
    sp = data.analysis.spreads[("fast", "c=1", "j_per_output_token")]
    assert sp.n == 2 and math.isfinite(sp.median)
    text = md.read_text()
    assert "(GPU throttled: hw_thermal_slowdown in 2/2 runs of fast, sw_power_cap in 2/2 runs " \
           "of fast; hw_thermal_slowdown in 2/2 runs of slow, sw_power_cap in 2/2" in text
    assert "8 of 8 ok runs stored a series" in text


def test_a_store_without_side_files_still_renders(finished, tmp_path):
    """One run stored by an earlier release (no telemetry_path), another whose file is gone:
    both are named, the others are drawn."""
    import sqlite3

    runs = [r for r in finished.runs("rep") if r.status == "ok"]
    gone = finished.load_point(runs[1].load_point_id)
    (finished.path.parent / gone.telemetry_path).unlink()
    db = sqlite3.connect(finished.path)
    db.execute("UPDATE load_points SET telemetry_path = NULL WHERE id = ?",
               (runs[0].load_point_id,))
    db.commit()
    db.close()
    md, page, _ = write(finished, "rep", tmp_path / "out")
    pan = _panel(page)
    assert sum(len(b["runs"]) for p in pan["panels"] for b in p["blocks"]) == 6
    notes = " ".join(pan["notes"])
    assert "1 run(s) have no stored time series" in notes
    assert f"the telemetry of load point {gone.id} is missing" in notes
    text = md.read_text()
    assert f"the telemetry of load point {gone.id} is missing" in text  # among the warnings
    assert "7 of 8 ok runs stored a series" in text and "| fast | c=1 | 2 |" in text


def test_report_noise_band_overrides_the_files(finished3, tmp_path):
    from typer.testing import CliRunner

    from servelab.cli import app
    from servelab.errors import UserError

    _, _, data = write(finished3, "rep", tmp_path / "a")
    e = data.analysis.effects[("fast", "c=1", "tpot_ms")]
    assert data.analysis.noise_band == 0.02 and e.verdict == "better"  # TPOT halves
    # a band wider than the effect's whole CI: the same data is no longer called a change
    assert e.ci_high < 1 - 0.02 and e.ci_low > 1 - 0.9
    _, _, wide = write(finished3, "rep", tmp_path / "b", noise_band=0.9)
    assert wide.analysis.effects[("fast", "c=1", "tpot_ms")].verdict == "within noise"
    assert "noise band +-90%" in (tmp_path / "b" / "report.md").read_text()
    args = ["report", "rep", "--store", str(finished3.path), "--noise-band", "2"]
    bad = CliRunner().invoke(app, args)
    assert isinstance(bad.exception, UserError)  # the CLI's main prints it as one line, exit 2
    assert "--noise-band 2: give a fraction in [0, 1)" in str(bad.exception)


def test_missing_request_files_are_a_warning_not_a_crash(finished, tmp_path):
    """A store copied without its results-requests/ files (seen when a device run's output came
    back partly): the report is written from the summaries and says what is missing."""
    runs = [r for r in finished.runs("rep") if r.status == "ok"]
    gone = finished.requests_file(finished.load_point(runs[0].load_point_id))
    gone.unlink()
    md, page, data = write(finished, "rep", tmp_path / "out")
    assert "per-request records of 1 of 8 runs are missing" in md.read_text()
    assert "| fast | c=1 | 2 |" in md.read_text()
    assert page.read_text().count('class="plot"') >= 4
    with pytest.raises(UserError, match="per-request records of load point .* are missing"):
        list(finished.requests(finished.load_point(runs[0].load_point_id)))


def test_truncated_request_file_is_a_warning_not_a_crash(finished, tmp_path):
    runs = [r for r in finished.runs("rep") if r.status == "ok"]
    f = finished.requests_file(finished.load_point(runs[1].load_point_id))
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])      # came back partly
    md, page, _ = write(finished, "rep", tmp_path / "out")
    assert "are unreadable" in md.read_text() and "leave that run out" in md.read_text()
    assert page.read_text().count('class="plot"') >= 4
    with pytest.raises(UserError, match="unreadable"):
        list(finished.requests(finished.load_point(runs[1].load_point_id)))


def test_report_out_writes_the_folder_and_refuses_a_file(finished, tmp_path, monkeypatch, capsys):
    """`report NAME --out DIR` writes report.md and report.html there; `--out` naming an existing
    file (not a folder) is one line naming the path, exit 2, never a traceback, and the file is
    left as it was."""
    from cli_inproc import cli

    store = str(finished.path)
    code, out, err = cli(monkeypatch, capsys, "report", "rep", "--store", store,
                         "--out", str(tmp_path / "dir"))
    assert code == 0, err
    assert (tmp_path / "dir" / "report.md").read_text().startswith("#")
    assert "<html" in (tmp_path / "dir" / "report.html").read_text()[:500].lower()
    assert str(tmp_path / "dir" / "report.html") in out
    plain = tmp_path / "plain.txt"
    plain.write_text("keep me")
    code, out, err = cli(monkeypatch, capsys, "report", "rep", "--store", store,
                         "--out", str(plain))
    assert code == 2, (code, out, err)
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(plain) in lines[0] and "check the path" in lines[0], lines[0]
    assert plain.read_text() == "keep me"


def test_markdown_shows_html_in_the_hypothesis_as_text(finished, tmp_path):
    """Before: report.md copied raw HTML from the hypothesis, which a markdown viewer runs."""
    import sqlite3

    hostile = "MTP <script>alert(1)</script><img src=x onerror=alert(2)> helps; p < 0.05, t <= 75"
    db = sqlite3.connect(finished.path)
    db.execute("UPDATE experiments SET spec = json_set(spec, '$.hypothesis', ?)", (hostile,))
    db.commit()
    db.close()
    md, _, _ = write(finished, "rep", tmp_path / "out")
    text = md.read_text()
    assert "<script" not in text and "<img" not in text and "</script" not in text
    assert "&lt;script>alert(1)&lt;/script>" in text and "p < 0.05, t <= 75" in text
