"""Energy per output token and GPU throttling in an experiment's statistics and its views
(console, markdown, --json). The load-point summaries are made by the telemetry's own summary
(telemetry/point.py) from GPU samples whose truth is known by construction: a GPU at P watts
for the 4 s around a load that generated N tokens spent 4P/N J per token, and a throttle mask
with the power-cap bit set in 3 of 5 runs is power-capped in 3 of 5 runs."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

from servelab.console import make_console
from servelab.experiment.design.parse import parse
from servelab.experiment.present import attribution
from servelab.experiment.report.data import collect
from servelab.experiment.report.document import experiment_document
from servelab.experiment.report.markdown import markdown
from servelab.experiment.stats import analysis as st
from servelab.experiment.stats.runs import RunValue
from servelab.experiment.stats.sequential import Design
from servelab.store import Store
from servelab.telemetry.gpu import GpuSample, GpuSeries
from servelab.telemetry.point import summarize
from servelab.telemetry.server import ServerSeries

SECONDS, TOKENS = 4, 600
IDLE, POWER_CAP = 0x1, 0x4  # NVML's clocks-event bits: GPU idle, software power cap


def _summary(power_w: float | None, tput: float, throttle: int = IDLE) -> dict:
    """A load point's summary: the bench's numbers and the telemetry's own fields from a GPU
    drawing `power_w` (None: no GPU, NVML n/a) over a load from 0.5 s to 3.5 s."""
    srv = ServerSeries(url="http://127.0.0.1:1/metrics", interval_s=1.0)
    for i in range(SECONDS + 1):
        srv.add(float(i), {"generation_tokens": TOKENS * i / SECONDS, "queued_requests": 0.0})
    if power_w is None:
        gpu = GpuSeries(interval_s=1.0, status="n/a: no NVIDIA GPU")
    else:
        gpu = GpuSeries(interval_s=1.0, gpus=[{"index": 0, "name": "NVIDIA H200"}])
        gpu.samples = [GpuSample(float(t), 0, 1980, 3201, power_w,
                                 int(5e6 + t * power_w * 1000), 60, 90, 40, throttle)
                       for t in range(SECONDS + 1)]
    sent = [(0.5 + 0.1 * i, 0.6 + 0.1 * i, 20.0) for i in range(31)]
    tel = summarize(srv, gpu, sent=sent, t_end_s=3.6, output_tokens=TOKENS)
    return {"output_throughput_tok_s": tput, "ttft_ms": {"median": 20.0},
            "tpot_ms": {"median": 5.0}, "completed": 31, "failed": 0,
            "total_output_tokens": TOKENS, **tel}


def _runs(gpu: bool = True) -> list[RunValue]:
    """5 blocks of arms a and b at c=1 and c=4; b draws 10% less power for the same tokens and
    is 10% faster; b's GPU is power-capped in blocks 0, 2, 4 at c=1 and never at c=4; a's GPU
    only ever idles between requests (not throttling)."""
    out = []
    for blk in range(5):
        for lk in ("c=1", "c=4"):
            for arm, watts, tput in (("a", 300.0, 100.0), ("b", 270.0, 110.0)):
                capped = arm == "b" and lk == "c=1" and blk % 2 == 0
                w = watts * (1 + 0.004 * blk) if gpu else None
                out.append(RunValue(arm, lk, blk, blk, _summary(
                    w, tput * (1 + 0.003 * blk), POWER_CAP | IDLE if capped else IDLE)))
    return out


def test_energy_per_arm_has_a_ci_and_a_verdict_and_throttling_is_named():
    runs = _runs()
    an = st.analyze(runs, baseline="a", arms=["a", "b"], load_keys=["c=1", "c=4"])
    # the telemetry's J/token is the GPU's joules over the window around the load / tokens
    want = [300.0 * (1 + 0.004 * b) * SECONDS / TOKENS for b in range(5)]
    s = an.spreads[("a", "c=1", "j_per_output_token")]
    assert s.n == 5 and s.median == pytest.approx(float(np.median(want)))
    assert s.ci_low <= s.median <= s.ci_high and math.isfinite(s.ci_low)
    inv = an.spreads[("a", "c=1", "output_tokens_per_j")]
    assert inv.median == pytest.approx(1 / float(np.median(want)))
    e = an.effects[("b", "c=1", "j_per_output_token")]
    assert e.ratio == pytest.approx(0.9, rel=1e-6) and e.ci_high < 0.98 and e.verdict == "better"
    e = an.effects[("b", "c=1", "output_tokens_per_j")]
    assert e.ratio == pytest.approx(1 / 0.9, rel=1e-6) and e.verdict == "better"  # higher: better
    # power cap in 3 of b's 5 runs at c=1; a's idle bit is no slowdown; nothing at c=4
    assert an.throttle_note("b", "c=1") == "GPU throttled: sw_power_cap in 3/5 runs of b"
    assert an.throttle[("a", "c=1")].reasons == {} and an.throttle[("a", "c=1")].measured == 5
    assert an.throttle_note("b", "c=4") is None
    line = st.headline(an, "output_throughput_tok_s")[0]
    assert "at c=1 (better; GPU throttled: sw_power_cap in 3/5 runs of b)" in line, line
    assert "at c=4 (better)" in line, line


def test_without_a_gpu_energy_is_nan_with_no_verdict_and_no_warning():
    an = st.analyze(_runs(gpu=False), baseline="a", arms=["a", "b"], load_keys=["c=1", "c=4"])
    for m in ("j_per_output_token", "output_tokens_per_j"):
        s = an.spreads[("b", "c=1", m)]
        assert s.n == 0 and math.isnan(s.median)
        e = an.effects[("b", "c=1", m)]
        assert math.isnan(e.ratio) and e.verdict == "n/a" and e.text() == "n/a"
    assert an.effects[("b", "c=1", "output_throughput_tok_s")].verdict == "better"
    assert not any("energy" in w or "joule" in w for w in an.warnings), an.warnings
    assert an.throttle[("b", "c=1")].measured == 0 and an.throttle_note("b", "c=1") is None
    # under adaptive repetitions too: nothing to decide, not an effect left undecided forever
    seq_an = st.analyze(_runs(gpu=False), baseline="a", arms=["a", "b"], load_keys=["c=1"],
                        design=Design(min_n=3, max_n=10))
    assert seq_an.effects[("b", "c=1", "j_per_output_token")].verdict == "n/a"
    assert seq_an.effects[("b", "c=1", "output_throughput_tok_s")].verdict == "better"


def _store(tmp_path, gpu: bool, runs: list[RunValue] | None = None) -> Store:
    """A real store holding `runs` (default: those of `_runs`) as an experiment, as the runner
    stores them."""
    spec = parse({"name": "en", "engine": "sglang", "model": "m", "arms": {"a": {}, "b": {
        "flags": {"chunked-prefill-size": 4096}}}, "baseline": "a",
        "load": {"concurrency": [1, 4]}, "repetitions": 5})
    store = Store(tmp_path / f"r{gpu}.db")
    store.ensure_experiment("en", spec.to_json(), "h")
    for seq, r in enumerate(_runs(gpu) if runs is None else runs):
        lp = store.add_load_point(summary=r.summary, provenance={"host": "h"},
                                  load_key=r.load_key, source="experiment", label=f"en/{r.arm}",
                                  concurrency=int(r.load_key[2:]))
        store.add_run(experiment="en", arm=r.arm, load_key=r.load_key, repetition=r.repetition,
                      block=r.block, seq=seq, status="ok", load_point_id=lp,
                      started=1e9 + seq, finished=1e9 + seq + 1)
    return store


def _row(text: str, start: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith(start))
    return [c.strip() for c in line.strip("|").split("|")]


def test_views_show_j_per_token_beside_the_verdict_and_the_throttling(tmp_path):
    with _store(tmp_path, gpu=True) as store:
        data = collect(store, "en")
        md = markdown(data)
        doc = experiment_document(data)
        buf = io.StringIO()
        attribution(make_console(file=buf, width=400, color_system=None), data)
    head, row = _row(md, "| arm | load |"), _row(md, "| b | c=1 |")
    j = data.analysis.spreads[("b", "c=1", "j_per_output_token")].median
    assert head[3:7] == ["output throughput (tok/s)", "J/tok (change)", "vs baseline [95% CI]",
                         "verdict"]
    assert row[4].startswith(f"{j:.3g} (-10.0% [") and row[4].endswith("] better)"), row
    assert row[6] == "better  (GPU throttled: sw_power_cap in 3/5 runs of b)"
    assert _row(md, "| b | c=4 |")[6] == "better"
    assert _row(md, "| a | c=1 |")[4] == f"{data.analysis.spreads[('a', 'c=1', 'j_per_output_token')].median:.3g}"
    notes = {(e["arm"], e["load_key"], e["metric"]): e["gpu_throttled"] for e in doc["effects"]}
    assert notes[("b", "c=1", "output_throughput_tok_s")] == \
        "GPU throttled: sw_power_cap in 3/5 runs of b"
    assert notes[("b", "c=4", "output_throughput_tok_s")] is None
    thr = {(t["arm"], t["load_key"]): t for t in doc["throttling"]}
    assert thr[("b", "c=1")]["reasons"] == {"sw_power_cap": 3} and thr[("a", "c=1")]["reasons"] == {}
    out = buf.getvalue()
    assert "better  (GPU throttled: sw_power_cap in 3/5 runs of b)" in out, out
    assert "GPU throttled: sw_power_cap in 3/5 runs of b" in "\n".join(doc["headline"])


def test_views_without_a_gpu_show_n_a_and_no_throttling(tmp_path):
    with _store(tmp_path, gpu=False) as store:
        data = collect(store, "en")
        md = markdown(data)
        doc = experiment_document(data)
    assert _row(md, "| b | c=1 |")[4] == "n/a" and _row(md, "| a | c=1 |")[4] == "n/a"
    assert _row(md, "| b | c=1 |")[6] == "better"
    assert "GPU throttled" not in md
    en = [e for e in doc["effects"] if e["metric"] == "j_per_output_token"]
    assert en and all(e["verdict"] == "n/a" and e["gpu_throttled"] is None for e in en)


def test_capacity_verdict_names_the_throttling_of_its_runs():
    from servelab.experiment.report.sections import capacity_rows

    runs = []
    for b in range(5):
        for arm, lo, hi, mask in (("a", 10.0, 11.0, IDLE), ("b", 20.0, 22.0, 0x40 | IDLE)):
            s = _summary(300.0, 100.0, mask if b < 2 else IDLE)
            s["capacity"] = {"status": "bracketed", "low_req_s": lo, "high_req_s": hi,
                             "synchronous_req_s": 1.0, "slo_text": "ttft_p99_ms <= 2000"}
            runs.append(RunValue(arm, "capacity", b, b, s))
    an = st.analyze(runs, baseline="a", arms=["a", "b"], load_keys=["capacity"])
    rows = capacity_rows(an.capacity_arms, [an.capacity["b"]],
                         {"b": an.throttle_note("b", "capacity")})
    assert rows[2][4] == "better  (GPU throttled: hw_thermal_slowdown in 2/5 runs of b)", rows


def _saturated_summary(tput: float) -> dict:
    """A load point whose server queue grew throughout its 10-s load (the telemetry's own
    steadiness test flags it), with the bench's numbers."""
    srv = ServerSeries(url="http://127.0.0.1:1/metrics", interval_s=0.5)
    for i in range(21):
        srv.add(0.5 * i, {"generation_tokens": 50.0 * i, "queued_requests": 2.0 * i,
                          "running_requests": 8.0})
    sent = [(0.1 * i, 0.1 * i + 2.0, 20.0 + 3.0 * i) for i in range(100)]
    tel = summarize(srv, GpuSeries(interval_s=0.5, status="n/a: no NVIDIA GPU"), sent=sent,
                    t_end_s=12.0, output_tokens=TOKENS)
    return {"output_throughput_tok_s": tput, "ttft_ms": {"median": 20.0},
            "tpot_ms": {"median": 5.0}, "completed": 100, "failed": 0, **tel}


def test_runs_above_saturation_are_named_beside_the_verdict(tmp_path):
    """b's load point at c=4 was above saturation in 2 of its 5 runs: every verdict at c=4
    names it (headline, attribution row, --json), and none at c=1."""
    runs = []
    for blk in range(5):
        for lk in ("c=1", "c=4"):
            for arm, tput in (("a", 100.0), ("b", 110.0)):
                t = tput * (1 + 0.003 * blk)
                sat = arm == "b" and lk == "c=4" and blk in (1, 3)
                runs.append(RunValue(arm, lk, blk, blk,
                                     _saturated_summary(t) if sat else _summary(None, t)))
    assert sum(r.summary["above_saturation"] is True for r in runs) == 2
    an = st.analyze(runs, baseline="a", arms=["a", "b"], load_keys=["c=1", "c=4"])
    assert an.saturation_note("b", "c=4") == "above saturation in 2/5 runs of b"
    assert an.saturation_note("b", "c=1") is None and an.verdict_note("b", "c=1") is None
    line = st.headline(an, "output_throughput_tok_s")[0]
    assert "at c=4 (better; above saturation in 2/5 runs of b)" in line, line
    assert "at c=1 (better)" in line, line
    with _store(tmp_path, gpu=False, runs=runs) as store:
        data = collect(store, "en")
        md, doc = markdown(data), experiment_document(data)
    assert _row(md, "| b | c=4 |")[6] == "better  (above saturation in 2/5 runs of b)"
    assert _row(md, "| b | c=1 |")[6] == "better"
    notes = {(e["arm"], e["load_key"]): e["above_saturation"] for e in doc["effects"]
             if e["metric"] == "output_throughput_tok_s"}
    assert notes == {("b", "c=1"): None, ("b", "c=4"): "above saturation in 2/5 runs of b"}
    assert {(t["arm"], t["load_key"]): t["above_saturation"] for t in doc["throttling"]}[
        ("b", "c=4")] == 2


def test_throttling_counts_out_of_the_runs_with_gpu_telemetry():
    """3 power-capped runs and 2 without NVML: 3 of the 3 measured, the 2 others named, not
    counted as unthrottled."""
    runs = []
    for blk in range(5):
        for arm in ("a", "b"):
            gpu = not (arm == "b" and blk >= 3)
            capped = arm == "b" and blk < 3
            runs.append(RunValue(arm, "c=1", blk, blk, _summary(
                300.0 if gpu else None, 100.0, POWER_CAP | IDLE if capped else IDLE)))
    an = st.analyze(runs, baseline="a", arms=["a", "b"], load_keys=["c=1"])
    assert an.throttle[("b", "c=1")].measured == 3
    assert an.throttle_note("b", "c=1") == \
        "GPU throttled: sw_power_cap in 3/3 runs of b (2 more without GPU telemetry)"
