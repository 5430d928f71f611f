"""What-if and Amdahl: the story's arithmetic, overlap, and the timeline sweep vs a brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.errors import UserError
from servelab.profile.analyze import analyze
from servelab.profile.synth import SynthKernel as K
from servelab.profile.synth import write_trace
from servelab.profile.whatif import amdahl, exclusive_by_label, parse_whatif, scaled_busy


def _story_steps(n_steps: int = 40):
    # per step (us): sparse decode 63, MoE GEMV 10, FP8 projections 6, all-reduce 2, rest 19
    parts = [("_tiled_sparse_decode_kernel", 63.0), ("fused_moe_kernel", 10.0),
             ("_w8a8_block_fp8_matmul", 6.0), ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 2.0),
             ("rms_norm_kernel", 10.0), ("act_and_mul_kernel", 9.0)]
    return [[K(n, d) for n, d in parts] for _ in range(n_steps)]


def test_story_63_percent_free_gives_at_most_2_7x(tmp_path):
    p = tmp_path / "story.json.gz"
    write_trace(p, _story_steps(), gpu_offset_us=0.0)
    r = analyze(p, whatifs=["attention=free"])
    cats = {c["category"]: c for c in r["categories"]}
    assert cats["attention"]["share"] == pytest.approx(0.63)
    assert cats["moe"]["share"] == pytest.approx(0.10)
    assert cats["gemm_fp8"]["share"] == pytest.approx(0.06)
    assert cats["communication"]["share"] == pytest.approx(0.02)
    speedup = r["what_if"]["speedup"]
    # wall = 100 us of kernels + 1 us host tail per step: slightly below pure Amdahl
    assert speedup <= 1 / (1 - 0.63) + 1e-9
    assert speedup == pytest.approx(101 / (101 - 63))
    assert round(amdahl(0.63), 1) == 2.7
    assert r["ranking"][0]["category"] == "attention"


def test_idle_time_caps_the_gain(tmp_path):
    """Same kernels, but each step is 200 us on the host: only 100 us of GPU work."""
    p = tmp_path / "idle.json"
    write_trace(p, _story_steps(10), step_wall_us=200.0, gpu_offset_us=0.0)
    r = analyze(p, whatifs=["attention=free"])
    assert r["idle_fraction"] == pytest.approx(0.5)
    assert r["what_if"]["speedup"] == pytest.approx(200 / (200 - 63))
    r2 = analyze(p, whatifs=["attention=2x"])
    assert r2["what_if"]["speedup"] == pytest.approx(200 / (200 - 31.5))


def test_overlapping_streams_save_only_the_uncovered_part(tmp_path):
    # attention 0-50 on stream 7; a copy kernel 30-70 on stream 9; gemm 70-100
    steps = [[K("flash_attn_fwd", 50.0, 0.0, 7), K("copy_kernel", 40.0, 30.0, 9),
              K("nvjet_gemm", 30.0, 70.0, 7)]] * 3
    p = tmp_path / "ovl.json"
    write_trace(p, steps, step_wall_us=100.0)
    r = analyze(p, whatifs=["attention=free"])
    # freeing attention removes 0-30 only (30-50 still has the copy running)
    assert r["what_if"]["speedup"] == pytest.approx(100 / 70)
    excl = {c["category"]: c["exclusive_us"] / 3 for c in r["categories"]}
    assert excl["attention"] == pytest.approx(30.0)
    assert excl["norm_elementwise"] == pytest.approx(20.0)  # copy alone: 50-70
    assert excl["gemm"] == pytest.approx(30.0)


def test_kernel_what_if_by_regex(tmp_path):
    p = tmp_path / "k.json"
    write_trace(p, _story_steps(4), gpu_offset_us=0.0)
    r = analyze(p, whatifs=["kernel:sparse_decode=free", "moe=2x"])
    assert r["what_if"]["speedup"] == pytest.approx(101 / (101 - 63 - 5))
    assert r["what_if"]["matched_activities"] == {"kernel:sparse_decode=free": 4, "moe=2x": 4}
    # a category the rules know but this trace lacks: speedup 1, and the note says why
    r2 = analyze(p, whatifs=["topk_sort=free"])
    assert r2["what_if"]["speedup"] == pytest.approx(1.0)
    assert "topk_sort=free matched no GPU activity" in r2["what_if"]["note"]


def test_bad_what_if_specs(tmp_path):
    cats, names = ["attention", "gemm"], ["flash_fwd"]
    with pytest.raises(UserError, match="TARGET=free"):
        parse_whatif("attention", cats, names)
    with pytest.raises(UserError, match="neither a category"):
        parse_whatif("tensor=free", cats, names)
    with pytest.raises(UserError, match="not 'free' or a speedup"):
        parse_whatif("gemm=fast", cats, names)
    with pytest.raises(UserError, match="no kernel name"):
        parse_whatif("kernel:xyz=2x", cats, names)
    w = parse_whatif("gemm=4x", cats, names)
    assert w.factor == 0.25 and not w.kernel
    assert math.isinf(parse_whatif("flash=free", cats, names).speedup)


def _brute(starts, ends, factors, grid=0.01):
    """Evaluate the timeline on a fine grid: each instant costs max(active factors)."""
    t = np.arange(0.0, max(ends) + grid, grid) + grid / 2
    busy = new = 0.0
    for x in t:
        act = [f for s, e, f in zip(starts, ends, factors, strict=True) if s <= x < e]
        if act:
            busy += grid
            new += grid * max(act)
    return busy, new


_iv = st.tuples(st.integers(0, 40), st.integers(1, 20), st.sampled_from([0.0, 0.5, 1.0]))


@settings(max_examples=40, deadline=None)
@given(st.lists(_iv, min_size=1, max_size=6))
def test_timeline_sweep_matches_brute_force(ivs):
    starts = [float(s) for s, _, _ in ivs]
    ends = [float(s + d) for s, d, _ in ivs]
    factors = [f for _, _, f in ivs]
    busy, new = scaled_busy(starts, ends, factors)
    b_busy, b_new = _brute(starts, ends, factors, grid=0.5)
    assert busy == pytest.approx(b_busy, abs=1e-6)
    assert new == pytest.approx(b_new, abs=1e-6)
    excl = exclusive_by_label(starts, ends, [str(f) for f in factors])
    for lab in {str(f) for f in factors}:
        b_only = _exclusive_brute(starts, ends, factors, lab)
        assert excl.get(lab, 0.0) == pytest.approx(b_only, abs=1e-6)


def _exclusive_brute(starts, ends, factors, lab, grid=0.5):
    t = np.arange(0.0, max(ends) + grid, grid) + grid / 2
    total = 0.0
    for x in t:
        labs = {str(f) for s, e, f in zip(starts, ends, factors, strict=True) if s <= x < e}
        if labs == {lab}:
            total += grid
    return total


def test_amdahl_values():
    assert amdahl(0.5, 2.0) == pytest.approx(1 / 0.75)
    assert amdahl(0.0) == 1.0
    with pytest.raises(ValueError):
        amdahl(1.5)


def test_vs_diffs_per_step_category_and_kernel_times(tmp_path):
    """A (40 story steps) vs B (10 steps, sparse decode 3x faster): per-step times, not totals."""
    from servelab.profile.analyze import compare

    a_path, b_path = tmp_path / "a.json", tmp_path / "b.json"
    write_trace(a_path, _story_steps(40), gpu_offset_us=0.0)
    faster = [[K(k.name, k.dur_us / 3 if "sparse" in k.name else k.dur_us) for k in st]
              for st in _story_steps(10)]
    write_trace(b_path, faster, gpu_offset_us=0.0)
    d = compare(analyze(a_path), analyze(b_path))
    cats = {r["key"]: r for r in d["categories"]}
    assert cats["attention"]["a_per_step_us"] == pytest.approx(63.0)
    assert cats["attention"]["b_per_step_us"] == pytest.approx(21.0)
    assert cats["attention"]["delta_us"] == pytest.approx(-42.0)
    assert cats["moe"]["ratio"] == pytest.approx(1.0)
    kern = {r["key"]: r for r in d["kernels"]}
    assert kern["_tiled_sparse_decode_kernel"]["ratio"] == pytest.approx(1 / 3)
    assert d["a_step_us"] == pytest.approx(101.0) and d["b_step_us"] == pytest.approx(59.0)
