"""servelab profile on the embedded engine's own `/start_profile` traces, recorded on the H200.

Fixtures `engine_graph.json.gz` (`--cuda-graph`) and `engine_eager.json.gz` are the first whole
steps of real traces, cut by `fixtures/trim_trace.py` (provenance in `fixtures/engine_meta.json`).
References here never use servelab's code: the raw JSON read with the stdlib, numpy sweep lines,
the per-kernel totals the trim script computed with plain loops, the launching `aten::` op of
each kernel (host call stack, eager trace), and servelab's analysis of the FULL trace made on the
device (for the steps the fixture kept).
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from servelab.profile.analyze import analyze
from servelab.profile.breakdown import breakdown, load_rules
from servelab.profile.html import profile_html
from servelab.profile.steps import find_steps
from servelab.profile.trace import read_trace

FIX = Path(__file__).parents[1] / "fixtures"
NAMES = ["engine_graph", "engine_eager"]
META = json.loads((FIX / "engine_meta.json").read_text())
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@cache
def _raw(name: str) -> tuple[dict, ...]:
    with gzip.open(FIX / f"{name}.json.gz", "rt") as f:
        return tuple(json.load(f)["traceEvents"])


@cache
def _analysed(name: str):
    t = read_trace(FIX / f"{name}.json.gz")
    ss = find_steps(t)
    return t, ss, breakdown(t, ss, load_rules())


def _windows(raw) -> list[tuple[str, float, float]]:
    return sorted(((e["name"], e["ts"], e["ts"] + e["dur"]) for e in raw
                   if e.get("cat") == "user_annotation" and e["name"].startswith("step[")),
                  key=lambda w: w[1])


def _launches(raw) -> dict[int, dict]:
    return {e["args"]["correlation"]: e for e in raw
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e["args"]}


def _sweep_busy(starts: np.ndarray, ends: np.ndarray) -> float:
    """Covered length by a +1/-1 sweep over sorted boundaries (not an interval merge)."""
    pts = np.concatenate([starts, ends])
    delta = np.concatenate([np.ones(len(starts)), -np.ones(len(ends))])
    order = np.lexsort((-delta, pts))  # at equal times open before close: touching = covered
    pts, depth = pts[order], np.cumsum(delta[order])
    return float(np.sum(np.diff(pts)[depth[:-1] > 0]))


def test_fixtures_are_small_real_h200_engine_traces():
    for name in NAMES:
        path = FIX / f"{name}.json.gz"
        assert path.stat().st_size < 300_000
        with gzip.open(path, "rt") as f:
            doc = json.load(f)
        assert doc["deviceProperties"][0]["name"] == "NVIDIA H200"  # the trace's own metadata
        rec = META[name]["recorded"]
        assert "H200" in rec["device"] and rec["date"] == "2026-11-29"
        assert "servelab serve --config flash --device cuda" in rec["command"]
        assert ("--cuda-graph" in rec["command"]) == (name == "engine_graph")
        assert META[name]["fixture_bytes_gz"] == path.stat().st_size


@pytest.mark.parametrize("name", NAMES)
def test_whole_steps_kept_as_the_device_saw_them(name):
    """The fixture's steps are the full trace's first steps, unchanged: servelab's analysis of the
    full trace on the device (kept in engine_meta.json) agrees step by step."""
    _, ss, _ = _analysed(name)
    full = META[name]["full_trace_analysis"]["steps"][: len(ss.steps)]
    assert [s.name for s in ss.steps] == [s["name"] for s in full] == META[name]["trim"]["steps"]
    for st, ref in zip(ss.steps, full, strict=True):
        assert st.wall_us == pytest.approx(ref["wall_us"], rel=1e-12)
        assert st.gpu_busy_us == pytest.approx(ref["gpu_busy_us"], rel=1e-12)
        assert len(st.activities) == ref["n_activities"]


@pytest.mark.parametrize("name", NAMES)
def test_engine_step_annotations_are_found_and_parsed(name):
    raw = _raw(name)
    _, ss, _ = _analysed(name)
    wins = _windows(raw)
    assert ss.source.startswith("annotation ^step\\[")
    assert [s.name for s in ss.steps] == [w[0] for w in wins]
    for st, (wname, _, _) in zip(ss.steps, wins, strict=True):
        phase, rest = wname[len("step["):-1].split(" ", 1)
        assert st.phase == phase and phase in ("EXTEND", "DECODE")
        assert st.batch_size == int(dict(kv.split("=") for kv in rest.split())["bs"])
    assert {s.phase for s in ss.steps} == {"EXTEND", "DECODE"}
    assert ss.outside_activities == ()  # the trim keeps no launch outside a step: none here


@pytest.mark.parametrize("name", NAMES)
def test_busy_idle_per_step_match_a_sweep_line(name):
    raw = _raw(name)
    _, ss, _ = _analysed(name)
    launch = _launches(raw)
    gpu = [e for e in raw if e.get("cat") in GPU_CATS]
    for st, (_, w0, w1) in zip(ss.steps, _windows(raw), strict=True):
        mine = [e for e in gpu if w0 <= launch[e["args"]["correlation"]]["ts"] <= w1]
        s = np.array([e["ts"] for e in mine])
        e = np.array([e["ts"] + e["dur"] for e in mine])
        wall = max(w1, e.max()) - w0
        busy = _sweep_busy(s, e)
        assert len(st.activities) == len(mine)
        assert st.gpu_busy_us == pytest.approx(busy, rel=1e-9)
        assert st.wall_us == pytest.approx(wall, rel=1e-12)
        assert st.idle_fraction == pytest.approx(1.0 - busy / wall, abs=1e-9)
    rep = analyze(FIX / f"{name}.json.gz")
    assert rep["gpu_busy_us"] == pytest.approx(sum(s.gpu_busy_us for s in ss.steps))


@pytest.mark.parametrize("name", NAMES)
def test_per_kernel_totals_equal_the_trim_scripts_plain_json_totals(name):
    t, _, bd = _analysed(name)
    ours: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for i in range(t.n_gpu):
        row = ours[t.names[t.name_idx[i]]]
        row[0] += t.dur_us[i]
        row[1] += 1
    ref = META[name]["kernel_totals"]
    assert set(ours) == set(ref)
    for kname, (total, count) in ours.items():
        assert total == pytest.approx(ref[kname]["total_us"], rel=1e-9)
        assert count == ref[kname]["count"]
    in_steps = META[name]["step_kernel_totals"]
    assert {k.name for k in bd.kernels} == set(in_steps)
    for k in bd.kernels:
        assert k.total_us == pytest.approx(in_steps[k.name]["total_us"], rel=1e-9)
        assert k.count == in_steps[k.name]["count"]


@pytest.mark.parametrize("name", NAMES)
def test_categories_sum_to_kernel_time(name):
    t, ss, bd = _analysed(name)
    in_steps = [i for st in ss.steps for i in st.activities]
    assert sum(c.total_us for c in bd.categories) == pytest.approx(
        sum(t.dur_us[i] for i in in_steps), rel=1e-12)
    assert sum(c.count for c in bd.categories) == len(in_steps)
    ref_total = sum(r["total_us"] for r in META[name]["step_kernel_totals"].values())
    assert bd.kernel_total_us == pytest.approx(ref_total, rel=1e-9)


def test_cuda_graph_kernels_count_in_the_step_of_their_launch():
    raw = _raw("engine_graph")
    _, ss, _ = _analysed("engine_graph")
    launch = _launches(raw)
    gpu = [e for e in raw if e.get("cat") in GPU_CATS]
    for st, (_, w0, w1) in zip(ss.steps, _windows(raw), strict=True):
        graph_ids = {c for c, r in launch.items()
                     if r["name"] == "cudaGraphLaunch" and w0 <= r["ts"] <= w1}
        replayed = [e for e in gpu if e["args"]["correlation"] in graph_ids]
        assert st.n_graph_launches == len(graph_ids) == 1
        assert st.n_graph_activities == len(replayed) > 100  # one launch, a whole forward
        # the replayed kernels run on the GPU long after their single host launch call
        assert max(e["ts"] for e in replayed) > min(launch[c]["ts"] for c in graph_ids) + 500
    _, ss_e, _ = _analysed("engine_eager")
    assert not any(e.get("name") == "cudaGraphLaunch" for e in _raw("engine_eager"))
    assert all(s.n_graph_launches == 0 for s in ss_e.steps)


def _launching_op(raw) -> dict[int, str]:
    """Correlation id -> innermost `cpu_op` enclosing its runtime call (same thread), by a
    stack sweep over the host events."""
    cpu = [e for e in raw if e.get("cat") == "cpu_op"]
    rts = [e for e in raw if e.get("cat") in ("cuda_runtime", "cuda_driver")
           and "correlation" in e["args"]]
    evs = sorted([(e["ts"], 0, -e["dur"], e) for e in cpu] + [(e["ts"], 1, 0, e) for e in rts],
                 key=lambda x: x[:3])
    stacks: dict = defaultdict(list)
    owner = {}
    for ts, kind, _, e in evs:
        st = stacks[e["tid"]]
        while st and st[-1]["ts"] + st[-1]["dur"] < ts:
            st.pop()
        if kind == 0:
            st.append(e)
        else:
            owner[e["args"]["correlation"]] = st[-1]["name"] if st else ""
    return owner


def test_rules_agree_with_the_launching_torch_op_on_engine_kernels():
    """Eager engine trace: the aten op that launched each kernel is the truth (host stack)."""
    raw = _raw("engine_eager")
    rules = load_rules()
    owner = _launching_op(raw)
    want = {"aten::mm": "gemm", "aten::bmm": "gemm", "aten::topk": "topk_sort",
            "aten::_fused_rms_norm": "norm_elementwise"}
    seen: dict[str, int] = defaultdict(int)
    for e in raw:
        if e.get("cat") != "kernel":
            continue
        op = owner.get(e["args"]["correlation"])
        if op in want:
            assert rules.classify(e["name"], 0) == want[op], (op, e["name"][:80])
            seen[op] += 1
    assert all(seen[op] > 0 for op in want), seen
    for e in raw:  # copies the engine issued are memcpy activities, all in the memcpy category
        if e.get("cat") in ("gpu_memcpy", "gpu_memset"):
            assert rules.classify(e["name"], 1 if e["cat"] == "gpu_memcpy" else 2) == "memcpy"


def test_graph_memcpy_nodes_are_copies_not_other():
    """In a CUDA graph a device copy replays as a driver kernel `memcpy32_post`/`memcpy128`."""
    raw = _raw("engine_graph")
    launch = _launches(raw)
    rules = load_rules()
    nodes = [e for e in raw if e.get("cat") == "kernel" and re.fullmatch(r"memcpy\d+\w*", e["name"])]
    assert nodes
    assert all(launch[e["args"]["correlation"]]["name"] == "cudaGraphLaunch" for e in nodes)
    assert {rules.classify(e["name"], 0) for e in nodes} == {"memcpy"}
    assert not any(re.fullmatch(r"memcpy\d+\w*", e.get("name", "")) for e in _raw("engine_eager")
                   if e.get("cat") == "kernel")


def test_what_the_analysis_says_about_the_engine():
    """Torch attention backend: no kernel is named as attention (its gather/bmm/softmax are
    generic kernels); top-k selection (indexer and router) is its own category; the GPU idles
    most of an eager decode step and far less of a graph-replayed one, per phase."""
    g = analyze(FIX / "engine_graph.json.gz")
    e = analyze(FIX / "engine_eager.json.gz")
    for rep in (g, e):
        cats = {c["category"]: c for c in rep["categories"]}
        assert "attention" not in cats and "other" not in cats
        assert {rep["categories"][0]["category"], rep["categories"][1]["category"]} == {
            "gemm", "norm_elementwise"}
        assert "topk_sort" in cats and rep["host_bound"]  # extend steps dominate the wall
    raw = {n: _raw(n) for n in NAMES}
    reports = {"engine_graph": g, "engine_eager": e}
    for name, lo, hi in (("engine_graph", 0.6, 1.0), ("engine_eager", 0.0, 0.2)):
        launch = _launches(raw[name])
        gpu = [x for x in raw[name] if x.get("cat") in GPU_CATS]
        busy = wall = 0.0
        for wname, w0, w1 in _windows(raw[name]):
            if not wname.startswith("step[DECODE"):
                continue
            mine = [x for x in gpu if w0 <= launch[x["args"]["correlation"]]["ts"] <= w1]
            s = np.array([x["ts"] for x in mine])
            t = np.array([x["ts"] + x["dur"] for x in mine])
            busy += _sweep_busy(s, t)
            wall += max(w1, t.max()) - w0
        assert lo < busy / wall < hi, (name, busy / wall)
        dec = reports[name]["phases"]["DECODE"]
        assert dec["gpu_busy_fraction"] == pytest.approx(busy / wall, rel=1e-9)
        assert dec["host_bound"] == (name == "engine_eager")
    # a few long prefill steps make the graph trace host-bound overall: the headline speaks of
    # the decode steps that set TPOT (GPU-bound), then of the prefill steps (host-bound)
    assert g["verdict"].startswith("TPOT is set by DECODE (8 steps, bs 8, median 2,352 us): "
                                   "GPU-bound, the GPU busy 68%")
    assert "Also EXTEND (2 steps, bs 1/7" in g["verdict"] and "HOST-BOUND" in g["verdict"]
    assert e["verdict"].startswith("TPOT is set by DECODE (2 steps, bs 4") and (
        "HOST-BOUND" in e["verdict"])
    assert g["all_steps"].startswith("all 10 steps (wall-weighted, phases mixed): GPU busy 24%")
    page = profile_html(g)
    assert "<td>DECODE</td>" in page and "<td>EXTEND</td>" in page
