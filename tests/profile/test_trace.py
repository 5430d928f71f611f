"""Trace reader and steps on real H200 traces (tests/profile/fixtures, see record_traces.py).

References are independent of servelab's code: the stdlib json module, numpy interval unions,
and torch's own per-kernel totals (`key_averages`, saved in meta.json when the traces were
recorded).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from servelab.errors import UserError
from servelab.profile.analyze import analyze
from servelab.profile.breakdown import breakdown, load_rules
from servelab.profile.steps import find_steps
from servelab.profile.trace import read_trace

FIX = Path(__file__).parent / "fixtures"
GPU_TRACES = ["eager_small", "graph_small", "eager_big", "graph_big"]
META = json.loads((FIX / "meta.json").read_text())


def _raw(name: str) -> list[dict]:
    with gzip.open(FIX / f"{name}.json.gz", "rt") as f:
        return json.load(f)["traceEvents"]


def _np_union(starts: np.ndarray, ends: np.ndarray) -> float:
    """Union length by sorting and a running maximum of ends (not servelab's merge loop)."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    gaps = np.clip(s[1:] - reach[:-1], 0.0, None)
    return float(reach[-1] - s[0] - gaps.sum())


def test_fixtures_are_small_and_from_the_h200():
    assert META["gpu"] == "NVIDIA H200"
    for name in GPU_TRACES + ["cpu_only"]:
        assert (FIX / f"{name}.json.gz").stat().st_size < 300_000


@pytest.mark.parametrize("name", GPU_TRACES)
def test_streaming_and_whole_file_parsers_agree(name):
    a = read_trace(FIX / f"{name}.json.gz", streaming=False)
    b = read_trace(FIX / f"{name}.json.gz", streaming=True)
    assert a.n_events == b.n_events == len(_raw(name))
    assert list(a.ts_us) == list(b.ts_us) and list(a.dur_us) == list(b.dur_us)
    assert [a.names[i] for i in a.name_idx] == [b.names[i] for i in b.name_idx]
    assert list(a.rt_corr) == list(b.rt_corr)
    assert a.annotations == b.annotations


@pytest.mark.parametrize("name", GPU_TRACES)
def test_per_kernel_totals_match_torch_key_averages(name):
    """Our per-name time and count equal torch's own aggregation of the same profile."""
    t = read_trace(FIX / f"{name}.json.gz")
    ours: dict[str, list[float]] = {}
    for i in range(t.n_gpu):
        row = ours.setdefault(t.names[t.name_idx[i]], [0.0, 0])
        row[0] += t.dur_us[i]
        row[1] += 1
    torch_totals = META["traces"][name]["key_averages"]
    for kname, (total, count) in ours.items():
        assert kname in torch_totals, f"{kname[:60]} missing from torch's key_averages"
        assert total == pytest.approx(torch_totals[kname]["self_device_us"], rel=1e-6, abs=1e-3)
        assert count == torch_totals[kname]["count"]


@pytest.mark.parametrize("name", GPU_TRACES)
def test_busy_idle_match_an_independent_computation(name):
    """Steps, attribution (correlation -> launch in the step's host range) and the union of
    kernel intervals, recomputed from the raw JSON with numpy."""
    raw = _raw(name)
    t = read_trace(FIX / f"{name}.json.gz")
    ss = find_steps(t)
    pat = "step[" if any(e.get("name", "").startswith("step[") for e in raw) else "ProfilerStep#"
    windows = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in raw
        if e.get("cat") == "user_annotation" and e["name"].startswith(pat)
    )
    launch = {e["args"]["correlation"]: e["ts"] for e in raw
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    gpu = [e for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert len(ss.steps) == len(windows)
    for st, (w0, w1) in zip(ss.steps, windows, strict=True):
        mine = [e for e in gpu if w0 <= launch.get(e["args"]["correlation"], -1) <= w1]
        s = np.array([e["ts"] for e in mine])
        e_ = np.array([e["ts"] + e["dur"] for e in mine])
        busy = _np_union(s, e_)
        end = max(w1, e_.max())
        assert len(st.activities) == len(mine)
        assert st.gpu_busy_us == pytest.approx(busy, rel=1e-9, abs=1e-6)
        assert st.wall_us == pytest.approx(end - w0, rel=1e-9)
        assert st.idle_fraction == pytest.approx(1 - busy / (end - w0), abs=1e-9)


@pytest.mark.parametrize("name", GPU_TRACES)
def test_categories_sum_to_kernel_time(name):
    t = read_trace(FIX / f"{name}.json.gz")
    ss = find_steps(t)
    bd = breakdown(t, ss, load_rules())
    in_steps = sum(t.dur_us[i] for st in ss.steps for i in st.activities)
    assert sum(c.total_us for c in bd.categories) == pytest.approx(in_steps, rel=1e-12)
    assert sum(c.count for c in bd.categories) == sum(len(st.activities) for st in ss.steps)
    assert sum(k.total_us for k in bd.kernels) == pytest.approx(in_steps, rel=1e-12)
    assert sum(c.share for c in bd.categories) == pytest.approx(1.0)


def test_real_kernels_land_in_the_expected_categories():
    t = read_trace(FIX / "eager_big.json.gz")
    bd = breakdown(t, find_steps(t), load_rules())
    by_name = {k.short: k.category for k in bd.kernels}
    assert any(c == "attention" for n, c in by_name.items() if "sdpa" in n)
    assert all(c == "gemm" for n, c in by_name.items() if n.startswith("nvjet"))
    assert by_name["vectorized_layer_norm_kernel<c10::BFloat16, float, true>"] == "norm_elementwise"


def test_cuda_graph_launches_are_recognised():
    g = analyze(FIX / "graph_small.json.gz")["cuda_graphs"]
    e = analyze(FIX / "eager_small.json.gz")["cuda_graphs"]
    raw = _raw("graph_small")
    graph_corr = {ev["args"]["correlation"] for ev in raw if ev.get("name") == "cudaGraphLaunch"}
    in_graph = [ev for ev in raw if ev.get("cat") == "kernel"
                and ev["args"]["correlation"] in graph_corr]
    assert g["graph_launches"] == len(graph_corr) == 5
    assert g["kernels_in_graphs"] == len(in_graph)
    spans, busys = [], []
    for c in graph_corr:
        ks = [ev for ev in in_graph if ev["args"]["correlation"] == c]
        starts = np.array([ev["ts"] for ev in ks])
        ends = np.array([ev["ts"] + ev["dur"] for ev in ks])
        spans.append(ends.max() - starts.min())
        busys.append(_np_union(starts, ends))
    assert g["mean_launch_span_us"] == pytest.approx(np.mean(spans))
    assert g["mean_launch_busy_us"] == pytest.approx(np.mean(busys))
    assert g["mean_launch_busy_us"] <= g["mean_launch_span_us"]
    assert e["graph_launches"] == 0 and e["kernels_in_graphs"] == 0


def test_host_bound_is_said_first():
    small = analyze(FIX / "eager_small.json.gz")
    big = analyze(FIX / "graph_big.json.gz")
    assert small["host_bound"] and small["verdict"].startswith("HOST-BOUND")
    assert small["idle_fraction"] > 0.9  # 2-layer d=512 eager decode: launches dominate
    # graph_big's steps are SGLang-named: the headline speaks of its DECODE phase
    assert not big["host_bound"] and big["verdict"].startswith("TPOT is set by DECODE (5 steps")
    assert "GPU-bound" in big["verdict"]


def test_sglang_step_annotations_are_preferred_and_parsed():
    r = analyze(FIX / "eager_big.json.gz")
    assert r["steps_from"].startswith("annotation ^step\\[")
    assert {s["phase"] for s in r["steps"]} == {"DECODE"}
    assert {s["batch_size"] for s in r["steps"]} == {32}
    r2 = analyze(FIX / "eager_big.json.gz", step_regex=r"^ProfilerStep#\d+$")
    assert r2["n_steps"] == 5 and r2["steps"][0]["name"] == "ProfilerStep#2"


def test_step_regex_matching_nothing_lists_annotations():
    with pytest.raises(UserError, match="matches no annotation.*ProfilerStep#2"):
        analyze(FIX / "eager_small.json.gz", step_regex="^nothing$")


def test_trace_without_gpu_events_says_so():
    with pytest.raises(UserError, match="no GPU events"):
        analyze(FIX / "cpu_only.json.gz")


@pytest.mark.parametrize("streaming", [False, True])
def test_truncated_trace_names_event_and_offset(tmp_path, streaming):
    data = gzip.decompress((FIX / "eager_small.json.gz").read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(UserError) as exc:
        read_trace(cut, streaming=streaming)
    msg = str(exc.value)
    assert "truncated" in msg and "event #" in msg and "byte" in msg and "last good event" in msg


def test_truncated_gzip_is_reported(tmp_path):
    blob = (FIX / "graph_small.json.gz").read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(UserError, match="truncated|corrupt"):
        read_trace(cut)


def test_corrupt_event_is_named(tmp_path):
    text = gzip.decompress((FIX / "graph_small.json.gz").read_bytes()).decode()
    k = text.index('"cat": "kernel"')
    bad = tmp_path / "bad.json"
    bad.write_text(text[:k] + '"cat": kernel!!' + text[k + 15:])
    with pytest.raises(UserError) as exc:
        read_trace(bad)
    assert "corrupt" in str(exc.value) and "event #" in str(exc.value)


def test_kernel_without_duration_is_named(tmp_path):
    doc = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k0", "ts": 1.0, "dur": 2.0, "args": {}},
        {"ph": "X", "cat": "kernel", "name": "broken_kernel", "ts": 5.0, "args": {}},
    ]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=r"event #1 \(kernel 'broken_kernel'\).*dur=None"):
        read_trace(p)


def test_not_a_trace(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"hello": 1}')
    with pytest.raises(UserError, match="traceEvents"):
        read_trace(p)
    with pytest.raises(UserError, match="does not exist"):
        read_trace(tmp_path / "missing.json")


def test_union_length_property():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from servelab.profile.steps import union_length

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.tuples(st.floats(0, 1e4), st.floats(0, 500)), min_size=1, max_size=30))
    def check(iv):
        s = [a for a, _ in iv]
        e = [a + d for a, d in iv]
        assert union_length(s, e) == pytest.approx(_np_union(np.array(s), np.array(e)), abs=1e-6)

    check()


def test_old_kineto_category_names(tmp_path):
    """torch 1.8-1.12 wrote cat "Kernel"/"Runtime"; the same trace in both spellings agrees."""
    raw = _raw("graph_small")
    old = {"kernel": "Kernel", "gpu_memcpy": "Memcpy", "cuda_runtime": "Runtime"}
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"traceEvents": [e | {"cat": old.get(e.get("cat"), e.get("cat"))}
                                             for e in raw]}))
    a, b = analyze(FIX / "graph_small.json.gz"), analyze(p)
    assert a["steps"] == b["steps"] and a["categories"] == b["categories"]
    assert b["cuda_graphs"]["graph_launches"] == 5


def _pipelined_trace(path: Path, lags: list[float], period: float = 10.0, kern: float = 10.0):
    """Host step every `period` us (5 us long); its graph replay runs `lag` us after the host
    start: lags > period - kern make the host run ahead of a GPU that is busy back to back."""
    ev, gpu_end = [], 0.0
    for k, lag in enumerate(lags):
        h0 = 1000.0 + period * k
        g0 = max(h0 + lag, gpu_end)  # one stream: a replay starts when the previous one ended
        gpu_end = g0 + kern
        ev += [
            {"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=8]", "ts": h0, "dur": 5.0},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": h0 + 1, "dur": 0.5,
             "args": {"correlation": k + 1}},
            {"ph": "X", "cat": "kernel", "name": "flash_fwd_kernel", "ts": g0, "dur": kern,
             "args": {"device": 0, "stream": 7, "correlation": k + 1}},
        ]
    path.write_text(json.dumps({"traceEvents": ev}))
    return ev


def test_host_running_ahead_of_a_busy_gpu_is_not_idle(tmp_path):
    """An overlap scheduler launches step k+1 while step k's kernels still run: steps must not
    overlap, or a GPU busy back to back reads as idle (it said HOST-BOUND, 60% idle, here)."""
    ev = _pipelined_trace(tmp_path / "p.json", [15.0] * 20)
    r = analyze(tmp_path / "p.json")
    k = [e for e in ev if e["cat"] == "kernel"]
    s = np.array([e["ts"] for e in k])
    e_ = s + np.array([e["dur"] for e in k])
    span = e_.max() - ev[0]["ts"]  # first host start to last kernel end, one contiguous window
    assert r["gpu_busy_us"] == pytest.approx(_np_union(s, e_))
    assert r["wall_us"] == pytest.approx(span)
    assert r["gpu_busy_fraction"] == pytest.approx(200.0 / 215.0)
    assert not r["host_bound"] and "GPU-bound, the GPU busy 100%" in r["verdict"]
    assert [st["wall_us"] for st in r["steps"][1:]] == pytest.approx([10.0] * 19)
    # the first step also holds the 15 us lag before the GPU starts: 2.5x its phase's median
    assert [w["index"] for w in r["warmup_steps"]] == [0]
    w = analyze(tmp_path / "p.json", whatifs=["attention=2x"])["what_if"]
    assert "host ran ahead of the GPU in 19 of 19 steps" in w["note"]  # steady-state steps


def test_step_walls_partition_the_union_of_step_windows(tmp_path):
    """Mixed lags (some steps overlap the previous one, some leave gaps): the walls add up to the
    length of the union of [host start, max(host end, kernel end)] windows, and busy to the union
    of all kernels."""
    lags = [2.0, 30.0, 3.0, 1.0, 25.0, 40.0, 2.0, 2.0, 50.0, 1.0]
    ev = _pipelined_trace(tmp_path / "m.json", lags, period=20.0, kern=12.0)
    r = analyze(tmp_path / "m.json")
    hosts = [e for e in ev if e["cat"] == "user_annotation"]
    kerns = [e for e in ev if e["cat"] == "kernel"]
    w0 = np.array([h["ts"] for h in hosts])
    w1 = np.maximum(w0 + 5.0, np.array([x["ts"] + x["dur"] for x in kerns]))
    assert r["wall_us"] == pytest.approx(_np_union(w0, w1))
    ks = np.array([x["ts"] for x in kerns])
    assert r["gpu_busy_us"] == pytest.approx(_np_union(ks, ks + 12.0))
    assert all(st["gpu_busy_us"] <= st["wall_us"] + 1e-9 for st in r["steps"])
    r2 = analyze(tmp_path / "m.json", whatifs=["attention=free"])  # the what-if sees the same walls
    steady = [st for st in r["steps"] if st["warmup"] is None]  # (over steady-state steps)
    assert len(steady) == r["n_steady_steps"] < len(r["steps"])
    assert r2["what_if"]["wall_us"] == pytest.approx(sum(st["wall_us"] for st in steady))
    assert r2["what_if"]["new_wall_us"] == pytest.approx(
        sum(st["wall_us"] - st["gpu_busy_us"] for st in steady))


def test_user_rules_replace_and_fallback(tmp_path):
    """`replace = true` drops the built-in rules; unmatched work goes to the user's fallback."""
    rules = tmp_path / "r.toml"
    rules.write_text('replace = true\nfallback = "rest"\n'
                     '[[rule]]\ncategory = "sdpa"\npatterns = ["sdpa"]\n'
                     '[[rule]]\ncategory = "copies"\nkinds = ["memcpy", "memset"]\npatterns = ["."]\n')
    raw = _raw("graph_big")
    t = read_trace(FIX / "graph_big.json.gz")
    ss = find_steps(t)
    bd = breakdown(t, ss, load_rules(rules))
    cats = {c.category: c for c in bd.categories}
    assert set(cats) == {"sdpa", "copies", "rest"}
    in_steps = {i for st in ss.steps for i in st.activities}
    names = [t.names[t.name_idx[i]] for i in sorted(in_steps)]
    kinds = [t.kind[i] for i in sorted(in_steps)]
    assert cats["sdpa"].count == sum("sdpa" in n for n, k in zip(names, kinds, strict=True) if k == 0)
    assert cats["copies"].count == sum(k != 0 for k in kinds)
    assert any(e.get("cat") == "gpu_memcpy" for e in raw) and cats["copies"].count > 0
    assert sum(c.total_us for c in bd.categories) == pytest.approx(bd.kernel_total_us)


@pytest.mark.parametrize("body,needle", [
    ('[[rule]]\ncategory = "x"\npatterns = "gemm"\n', "needs 'patterns'"),
    ('[[rule]]\ncategory = "x"\npatterns = ["("]\n', "bad regex"),
    ('[[rule]]\ncategory = "x"\nkinds = ["tensor"]\npatterns = ["a"]\n', "unknown kinds"),
    ('rule = 3\n', "array of tables"),
])
def test_bad_rules_files_are_named(tmp_path, body, needle):
    p = tmp_path / "bad.toml"
    p.write_text(body)
    with pytest.raises(UserError, match=needle):
        load_rules(p)


@pytest.mark.parametrize("name,category", [
    # kernel names as public engines and libraries define them (FlashMLA, FlashAttention, DeepEP,
    # NCCL, SGLang/vLLM custom all-reduce and Triton kernels, DeepGEMM, FlashInfer)
    ("void smxx::decode::flash_fwd_mla_combine_kernel<cutlass::bfloat16_t>(Params)", "attention"),
    ("flash::flash_fwd_splitkv_mla_combine_kernel", "attention"),
    ("flash::flash_fwd_splitkv_mla_kernel", "attention"),
    ("flash_fwd_splitkv_combine_kernel", "attention"),
    ("flashinfer::MergeStatesKernel", "attention"),
    ("_tiled_sparse_decode_kernel", "attention"),
    ("void deep_ep::intranode::combine<8, 768>(void*)", "communication"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("cross_device_reduce_1stage", "communication"),
    ("fused_moe_kernel", "moe"),
    ("_w8a8_block_fp8_matmul", "gemm_fp8"),
    ("deep_gemm::fp8_gemm_kernel", "gemm_fp8"),
    ("_layer_norm_fwd_kernel", "norm_elementwise"),
])
def test_public_kernel_names_land_in_their_category(name, category):
    """A split-KV attention combine is attention, not expert-parallel communication (FlashMLA's
    combine read as communication before)."""
    assert load_rules().classify(name, 0) == category
