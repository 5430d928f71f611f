"""Sparse MLA decode kernels against an exact (float64) reference, with the derived tolerances
of tests/lib/mla_check.py. Without CUDA the Triton kernels run in the interpreter with
fp16/fp32 inputs (bf16 tl.dot is wrong there); with CUDA everything runs compiled, bf16 and
the real-model shapes included. Kernel choice, fallbacks and graph replay:
dispatch/test_launch.py."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from mla_check import (
    DEVICES,
    assert_close,
    bounds,
    dtypes,
    gluon_here,
    interpreted_kernels,
    make,
    partials_rounded,
    poisoned,
)

from servelab.kernels import sparse_mla
from servelab.kernels.sparse_mla import bytes as mla_bytes
from servelab.kernels.sparse_mla import flops, sparse_mla_decode

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
assert interpreted_kernels  # the module-scoped autouse fixture, imported to take effect here


# (B, H, D_qk, d_v, topk): topk 37/70 are not multiples of the 32-token tile; H 20 spans two
# 16-head blocks; D_qk == d_v has no score-only tail.
CASES = {
    "tail": (2, 5, 48, 32, 37),
    "b1": (1, 3, 48, 32, 70),
    "no_tail_two_head_blocks": (3, 20, 32, 32, 45),
    "odd_dims": (2, 4, 40, 24, 33),
}


def _run_and_check(variant, q, kv, idx, d_v, num_splits=None):
    dtype = q.dtype
    b, h, d_qk = q.shape
    sm_scale = d_qk**-0.5
    out, lse = poisoned(b, h, d_v, dtype, q.device)
    p16 = False
    if variant == "splitkv":  # the public call's default, through the call that records it
        from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch

        run = splitkv_launch(q, kv, idx, sm_scale, d_v, num_splits=num_splits, out=out, lse=lse)
        got_o, got_l, p16 = run.out, run.lse, partials_rounded(run.ran)
        # a default rule ran; only Gluon rules are skipped, and only where Gluon cannot run
        assert run.ran.rule is not None and (not run.ran.skipped or not gluon_here()), run.ran
    else:
        got_o, got_l = sparse_mla_decode(q, kv, idx, sm_scale, d_v, variant=variant,
                                         num_splits=num_splits, out=out, lse=lse)  # fmt: skip
    assert got_o.data_ptr() == out.data_ptr() and got_o.dtype == dtype
    out_ex, lse_ex, out_tol, lse_tol = bounds(q, kv, idx, sm_scale, d_v, dtype,
                                              partial_rounded=p16)  # fmt: skip
    assert_close(f"{variant} out", got_o, out_ex, out_tol)
    assert_close(f"{variant} lse", got_l, lse_ex, lse_tol)
    return got_o, got_l


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["naive", "splitkv", "reference"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_exact_reference(device, variant, case):
    b, h, d_qk, d_v, topk = CASES[case]
    for dtype in dtypes(device):
        q, kv, idx = make(device, dtype, b, h, d_qk, topk, seed=hash(case) % 1000)
        _run_and_check(variant, q, kv, idx, d_v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["naive", "splitkv"])
def test_duplicates_and_all_padding_rows(device, variant):
    """Row 0: every slot the same KV row plus padding (softmax over duplicates = uniform,
    out = that row's values). Row 1: only padding -> out 0 exactly, lse -inf. Row 2: padding
    only in the first 40 slots (the first split(s) see nothing at all)."""
    dtype = torch.float16
    q, kv, idx = make(device, dtype, 3, 4, 48, 70, pad_frac=0.0, seed=7)
    idx[0] = 5
    idx[0, 1::4] = -1
    idx[1] = -1
    idx[2, :40] = -1
    got_o, got_l = _run_and_check(variant, q, kv, idx, 32, num_splits=None)
    assert torch.all(got_o[1] == 0) and torch.all(torch.isneginf(got_l[1]))
    expect_row = kv[5, :32].float().cpu().expand(4, 32)
    assert torch.allclose(got_o[0].float().cpu(), expect_row, atol=0, rtol=2 * 2.0**-11)
    n_valid = int((idx[0] >= 0).sum())
    s = (q[0].double() @ kv[5].double()).cpu() * 48**-0.5
    expect_lse = s + math.log(n_valid)
    assert torch.allclose(got_l[0].double().cpu(), expect_lse, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_split_counts_agree(device):
    """Any split count, including more splits than tiles (empty splits), gives the exact
    result within tolerance; partial buffers are NaN-poisoned so an unwritten one shows."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.splitkv.geometry import SplitConfig

    dtype = torch.float16
    b, h, d_qk, d_v, topk = 2, 5, 48, 32, 100  # 4 tiles of 32 (7 of 16)
    q, kv, idx = make(device, dtype, b, h, d_qk, topk, seed=3)
    idx[1, :50] = -1  # the first splits of request 1 see only padding
    out_ex, lse_ex, out_tol, lse_tol = bounds(q, kv, idx, d_qk**-0.5, d_v, dtype)
    cfgs = [SplitConfig(block_h=16, block_n=32, num_warps=4, prefetch_idx=p) for p in (1, 0)]
    cfgs.append(SplitConfig(block_h=16, block_n=16, num_warps=4, kernel="triton_rp"))
    for cfg, splits in [(c, s) for c in cfgs for s in (1, 2, 3, 4, 6, 7)]:
        out, lse = poisoned(b, h, d_v, dtype, device)
        ws = (
            torch.full((b, splits, h, d_v), float("nan"), device=device),
            torch.full((b, splits, h), float("nan"), device=device),
        )
        run = splitkv_launch(
            q, kv, idx, d_qk**-0.5, d_v, num_splits=splits, config=cfg, out=out, lse=lse,
            workspace=ws if splits > 1 else None,
        )  # fmt: skip
        assert_close(f"{cfg} splits={splits} out", run.out, out_ex, out_tol)
        assert_close(f"{cfg} splits={splits} lse", run.lse, lse_ex, lse_tol)
        assert (run.ran.variant, run.ran.num_splits, run.ran.rule) == (cfg.kernel, splits, None)


@pytest.mark.parametrize("device", DEVICES)
def test_16_bit_partials(device):
    """partial_dtype="input": partials rounded to q's dtype (half the bytes the merge moves),
    with both FP8 Triton kernels; the bound adds u_in M for that rounding. Also: a partial
    buffer of the wrong dtype is refused."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_decode, splitkv_launch
    from servelab.kernels.sparse_mla.fp8 import dequantize_kv, quantize_kv
    from servelab.kernels.sparse_mla.splitkv.geometry import SplitConfig

    dtype = torch.float16
    b, h, d_qk, d_v, topk = 2, 5, 48, 32, 100
    q, kv, idx = make(device, dtype, b, h, d_qk, topk, seed=17)
    idx[1, :64] = -1
    cache = quantize_kv(kv, 32, 16)
    for src, kv_ref in ((kv, kv), (cache, dequantize_kv(cache))):
        fp8 = src is cache
        ex_o, ex_l, tol_o, tol_l = bounds(q, kv_ref, idx, d_qk**-0.5, d_v, dtype,
                                           kv_rounded=fp8, partial_rounded=True)  # fmt: skip
        for kernel in ("triton_fp8_chunked", "triton") if fp8 else ("triton",):
            cfg = SplitConfig(16, 32, 4, merge="kernel", partial_dtype="input", kernel=kernel)
            out, lse = poisoned(b, h, d_v, dtype, device)
            run = splitkv_launch(q, src, idx, d_qk**-0.5, d_v, num_splits=3, config=cfg,
                                 out=out, lse=lse)  # fmt: skip
            tag = f"16-bit partials fp8={fp8} {kernel}"
            r = run.ran
            assert (r.variant, r.merge, r.partials, r.tile) == (kernel, "kernel", "float16",
                                                                "16x32"), (tag, r)  # fmt: skip
            assert_close(f"{tag} out", run.out, ex_o, tol_o)
            assert_close(f"{tag} lse", run.lse, ex_l, tol_l)
    bad = (torch.empty(b, 3, h, d_v, dtype=torch.bfloat16, device=device),
           torch.empty(b, 3, h, device=device))  # fmt: skip
    with pytest.raises(ValueError, match="workspace"):
        splitkv_decode(q, kv, idx, d_qk**-0.5, d_v, num_splits=3, workspace=bad)


@pytest.mark.parametrize("device", DEVICES)
def test_many_splits_combine_in_column_slices(device):
    """200 splits over 4 tiles (196 empty): the combine then works in 32-column slices of
    d_v = 64, so both slices and the empty-split weighting are exercised."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_decode
    from servelab.kernels.sparse_mla.splitkv.geometry import SplitConfig

    dtype = torch.float16
    b, h, d_qk, d_v, topk = 2, 3, 80, 64, 100
    q, kv, idx = make(device, dtype, b, h, d_qk, topk, seed=5)
    out_ex, lse_ex, out_tol, lse_tol = bounds(q, kv, idx, d_qk**-0.5, d_v, dtype)
    out, lse = poisoned(b, h, d_v, dtype, device)
    o, lg = splitkv_decode(q, kv, idx, d_qk**-0.5, d_v, num_splits=200, out=out, lse=lse,
                           config=SplitConfig(block_h=16, block_n=32, num_warps=4))  # fmt: skip
    assert_close("200 splits out", o, out_ex, out_tol)
    assert_close("200 splits lse", lg, lse_ex, lse_tol)


@pytest.mark.parametrize("device", DEVICES)
def test_merge_kernel_against_a_float64_merge(device):
    """The merge kernel alone (d_v = 96; 3 and 20 splits: one column slice per head, 200
    splits: two 64-column slices; and d_v = 512 with 20 bf16 splits, the shipped 16-bit
    geometry: one [32, 512] tile, two column warps, chunks of 16), with fp32, fp16 and bf16
    partials, in the default and other geometries: empty splits (lse
    -inf, O garbage that must weigh 0), one head with every split empty (out 0, lse -inf) and,
    at 200 splits, lse values spread over +-100 (exp overflows fp32 unless the merge subtracts
    the maximum first), against lse = log sum_s exp(lse_s), O = sum_s exp(lse_s - lse) O_s in
    float64. Tolerance: the fp32 weights and sum (2 S ulp of the largest |O_s|), then the
    output's fp16 rounding."""
    from servelab.kernels.sparse_mla.splitkv.merge import launch_merge

    gen = torch.Generator(device="cpu").manual_seed(1)
    b, h = 3, 20
    for s, p_dtype, spread, d_v in ((3, torch.float32, 4, 96), (20, torch.float16, 4, 96),
                                    (200, torch.bfloat16, 100, 96),
                                    (20, torch.bfloat16, 4, 512)):  # fmt: skip
        po = torch.randn(b, s, h, d_v, generator=gen).to(p_dtype)
        plse = spread * torch.randn(b, s, h, generator=gen).clamp(-1, 1)
        plse[0, 1:, 2] = -math.inf  # one split left
        plse[1, :, 7] = -math.inf  # nothing at all: out 0, lse -inf
        plse[2, 0, :] = -math.inf  # an empty split for every head of a request
        lse_ex = torch.logsumexp(plse.double(), dim=1)
        w = torch.exp(plse.double() - lse_ex[:, None].nan_to_num(neginf=0.0))
        out_ex = (w[..., None] * po.double()).sum(1)
        out_ex[1, 7] = 0.0
        # The default geometry, then other warps and column slices (the probes' overrides).
        geometries = [{}]
        if d_v == 96 and s < 200:  # the interpreter runs every program: others at 3, 20 splits
            geometries += [{"column_warps": True}, {"num_warps": 2, "block_dvc": 32},
                           {"num_warps": 8}, {"s_chunk": 4, "block_dvc": 64}]  # fmt: skip
        for geometry in geometries:
            out = torch.full((b, h, d_v), math.nan, dtype=torch.float16, device=device)
            lse = torch.full((b, h), math.nan, dtype=torch.float32, device=device)
            launch_merge((po.to(device), plse.to(device)), out, lse, pdl=False, **geometry)
            tol = 2**-11 * out_ex.abs() + 2 * s * 2**-24 * po.double().abs().amax() + 1e-7
            err = (out.cpu().double() - out_ex).abs()
            assert torch.all(err <= tol), (s, geometry, (err - tol).max().item())
            fin = torch.isfinite(lse_ex)
            assert torch.all(torch.isneginf(lse.cpu()[~fin])) and (~fin).sum() == 1
            assert torch.allclose(lse.cpu()[fin].double(), lse_ex[fin], rtol=2**-22, atol=1e-5)


def test_merge_geometry_overrides_are_checked():
    """launch_merge's overrides are powers of two in range; a bad one is a one-line error
    naming it (not a crash inside the grid arithmetic or the compiler)."""
    from servelab.kernels.sparse_mla.splitkv.merge import launch_merge

    po, plse = torch.randn(1, 3, 2, 32), torch.randn(1, 3, 2)
    out, lse = torch.empty(1, 2, 32), torch.empty(1, 2)
    for kw, name in (({"num_warps": 0}, "num_warps"), ({"num_warps": 3}, "num_warps"),
                     ({"block_dvc": 0}, "block_dvc"), ({"block_dvc": 24}, "block_dvc"),
                     ({"tile_elems": 1000}, "tile_elems"), ({"s_chunk": 3}, "s_chunk"),
                     ({"s_chunk": 0}, "s_chunk")):  # fmt: skip
        with pytest.raises(ValueError, match=name):
            launch_merge((po, plse), out, lse, pdl=False, **kw)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="globaltimer and %smid need a GPU")
def test_merge_trace_records_every_program():
    """launch_merge(trace=...): every program writes its SM id (below the SM count) and three
    globaltimer stamps in order (entry <= after the wait <= end); the output is unchanged."""
    from servelab.kernels.sparse_mla.splitkv.merge import launch_merge, merge_grid

    b, s, h, d_v = 2, 5, 6, 64
    po = torch.randn(b, s, h, d_v, device="cuda")
    plse = torch.randn(b, s, h, device="cuda")
    outs = []
    for trace in (None, torch.full((4 * b * h * 2,), -1, dtype=torch.int64, device="cuda")):
        out = torch.full((b, h, d_v), math.nan, dtype=torch.float16, device="cuda")
        lse = torch.full((b, h), math.nan, device="cuda")
        launch_merge((po, plse), out, lse, pdl=False, block_dvc=32, trace=trace)
        outs.append(out)
    torch.cuda.synchronize()
    assert merge_grid(tuple(po.shape), 32)[0] == (b, h, 2)
    assert torch.equal(outs[0], outs[1])
    tr = trace.view(-1, 4).cpu()
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert torch.all((tr[:, 0] >= 0) & (tr[:, 0] < n_sms))
    assert torch.all((tr[:, 1] > 0) & (tr[:, 1] <= tr[:, 2]) & (tr[:, 2] <= tr[:, 3]))
    with pytest.raises(ValueError, match="trace must be int64"):
        launch_merge((po, plse), out, lse, pdl=False, trace=torch.zeros(3, device="cuda"))


@pytest.mark.parametrize("device", DEVICES)
def test_pdl_merge_matches(device):
    """merge="pdl" (the merge kernel as a programmatic dependent; the plain kernel in the
    interpreter): several split counts (6 > 4 tiles: empty splits), two head blocks,
    padding, an all-padding request and a request whose first splits see only padding;
    every call repeated on the same poisoned buffers, each against the exact result."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.splitkv.geometry import SplitConfig

    dtype = torch.float16
    b, h, d_qk, d_v, topk = 3, 20, 48, 32, 100  # 4 tiles of 32; H 20 = two 16-head blocks
    q, kv, idx = make(device, dtype, b, h, d_qk, topk, seed=13)
    idx[1] = -1
    idx[2, :70] = -1
    out_ex, lse_ex, out_tol, lse_tol = bounds(q, kv, idx, d_qk**-0.5, d_v, dtype)
    cfg = SplitConfig(block_h=16, block_n=32, num_warps=4, merge="pdl")
    for splits in (1, 2, 3, 4, 6, 2):
        for rep in range(2):
            out, lse = poisoned(b, h, d_v, dtype, device)
            ws = (
                torch.full((b, splits, h, d_v), float("nan"), device=device),
                torch.full((b, splits, h), float("nan"), device=device),
            )
            run = splitkv_launch(q, kv, idx, d_qk**-0.5, d_v, num_splits=splits, config=cfg,
                                 out=out, lse=lse, workspace=ws)  # fmt: skip
            o, lg = run.out, run.lse
            tag = f"pdl splits={splits} rep={rep}"
            # on the CPU "pdl" runs as the plain merge kernel (no griddepcontrol there)
            want = "single" if splits == 1 else "kernel" if device == "cpu" else "pdl"
            assert run.ran.merge == want, (tag, run.ran)
            assert_close(f"{tag} out", o, out_ex, out_tol)
            assert_close(f"{tag} lse", lg, lse_ex, lse_tol)
            assert torch.all(o[1] == 0) and torch.all(torch.isneginf(lg[1])), tag


# H200, 2026-11-29, `bench_sparse_mla.py --compare` (us per call, two kernels vs PDL):
# (H, topk, B) -> (kernel_us, pdl_us). The default merge must pick the faster one, or one
# within 0.5% of it.
MEASURED_MERGE = {
    (64, 640, 1): (8.46, 8.08), (64, 640, 2): (10.19, 9.73), (64, 640, 4): (11.83, 11.25),
    (64, 640, 8): (15.11, 15.20), (32, 640, 1): (8.07, 7.41), (32, 640, 2): (8.33, 7.99),
    (32, 640, 4): (10.28, 9.75), (32, 640, 8): (12.72, 12.10), (16, 2048, 1): (10.05, 9.37),
    (16, 2048, 2): (11.19, 11.04), (16, 2048, 4): (13.66, 14.17), (16, 2048, 8): (17.69, 18.18),
    (128, 2048, 1): (14.90, 15.48), (128, 2048, 2): (18.94, 19.10),
    (128, 2048, 4): (29.21, 29.33), (128, 2048, 8): (33.67, 33.58),
    (128, 1152, 1): (12.39, 11.81), (128, 1152, 2): (14.18, 13.59),
    (128, 1152, 4): (19.69, 20.04), (128, 1152, 8): (25.80, 24.79),
}  # fmt: skip


def test_default_merge_picks_the_measured_faster():
    """The defaults file's `[merge]` rule, applied to the Triton defaults the timings were
    taken with, picks PDL or the plain merge kernel as measured (or within 0.5%)."""
    from servelab.kernels.sparse_mla.dispatch.defaults import default_config, load
    from servelab.kernels.sparse_mla.splitkv.geometry import choose_num_splits as choose
    from servelab.kernels.sparse_mla.splitkv.geometry import resolve_merge

    policy = load().merge
    for (h, topk, b), (k_us, p_us) in MEASURED_MERGE.items():
        d_qk = 576 if topk == 2048 else 512
        cfg = default_config(b, h, d_qk, gluon=False)  # the table's kernels
        s = choose(b, h, topk, cfg, 132)
        got = resolve_merge(cfg, b, h, s, 132, policy, pdl_ok=True)
        chosen, other = (p_us, k_us) if got == "pdl" else (k_us, p_us)
        assert got in ("pdl", "kernel") and chosen <= other * 1.005, (h, topk, b, got)
    # Forced choices are kept; one split needs no merge; no PDL without the hardware.
    cfg = default_config(1, 64, 512)
    for m in ("kernel", "pdl"):
        assert resolve_merge(replace(cfg, merge=m), 1, 64, 20, 132, policy, True) == m
    assert resolve_merge(cfg, 1, 64, 1, 132, policy, True) == "single"
    assert resolve_merge(replace(cfg, merge="pdl"), 1, 64, 20, 132, policy, False) == "kernel"


# Same run, FP8: (H, scale tile, B) -> (reshape kernel us, per-chunk kernel us).
MEASURED_FP8 = {
    (64, 64, 1): (11.03, 13.41), (64, 64, 2): (16.80, 14.33), (64, 64, 4): (24.76, 19.70),
    (64, 64, 8): (33.55, 27.12), (64, 64, 16): (26.73, 38.43), (64, 64, 128): (82.15, 147.87),
    (32, 64, 16): (34.16, 28.04), (32, 64, 128): (155.91, 146.29),
    (16, 128, 16): (28.71, 31.30), (16, 128, 128): (168.48, 192.16),
}  # fmt: skip


def test_default_fp8_kernel_is_the_measured_faster():
    from servelab.kernels.sparse_mla.dispatch.defaults import default_config

    for (h, tile, b), (old_us, new_us) in MEASURED_FP8.items():
        d_qk = 576 if tile == 128 else 512
        kernel = default_config(b, h, d_qk, fp8_tile=tile, gluon=False).kernel
        assert kernel in ("triton", "triton_fp8_chunked"), (h, tile, b, kernel)
        assert (kernel == "triton_fp8_chunked") == (new_us < old_us), (h, tile, b)


def test_choose_num_splits_fills_the_machine():
    from servelab.kernels.sparse_mla.splitkv.geometry import SplitConfig, choose_num_splits

    cfg = SplitConfig(block_h=64, block_n=32, ctas_per_sm=1)
    # V4-Flash at B=1: 1 head block, 20 tiles, 132 SMs -> every tile its own program.
    assert choose_num_splits(1, 64, 640, cfg, 132) == 20
    # V3.2 at B=1: 2 head blocks x 64 tiles; 66 splits wanted -> 64 (one tile each).
    assert choose_num_splits(1, 128, 2048, cfg, 132) == 64
    # B=8, H=128: 16 programs without splitting; 132 // 16 = 8 splits of 8 tiles each.
    assert choose_num_splits(8, 128, 2048, cfg, 132) == 8
    # Two programs per SM: twice the splits (16 tiles of 4).
    assert choose_num_splits(8, 128, 2048, SplitConfig(block_h=64, ctas_per_sm=2,
                             block_n=32), 132) == 16  # fmt: skip
    # Grid already full: no split, no combine.
    assert choose_num_splits(128, 128, 2048, cfg, 132) == 1
    for b in (1, 2, 3, 5, 8, 16, 33, 64):
        for topk in (32, 100, 640, 2048):
            s = choose_num_splits(b, 64, topk, cfg, 132)
            tiles = math.ceil(topk / 32)
            per = math.ceil(tiles / s)
            assert 1 <= s <= tiles and (s - 1) * per < tiles  # no empty split
            assert b * s <= max(132, b)  # never more programs than one wave (waves=1)


def test_flops_and_bytes_hand_count():
    # V3.2, B=1: 2 * 128 heads * 2048 slots * (576 + 512) = 570,425,344 FLOPs.
    assert flops(1, 128, 2048, 576, 512) == 570_425_344
    # bf16: KV 2048*576*2 = 2,359,296; q 128*576*2 = 147,456; out 128*512*2 = 131,072;
    # lse 128*4 = 512; indices 2048*4 = 8,192 -> 2,646,528 bytes.
    assert mla_bytes(1, 128, 2048, 576, 512) == 2_646_528
    # V4-Flash FP8 layout (584 B/token), B=4: KV 4*640*584 = 1,495,040; q 4*64*512*2 =
    # 262,144; out 262,144; lse 1,024; indices 10,240 -> 2,030,592.
    assert mla_bytes(4, 64, 640, 512, 512, kv_bytes_per_token=584) == 2_030_592
    assert flops(4, 64, 640, 512, 512) == 4 * 2 * 64 * 640 * 1024


def test_bad_inputs_are_named():
    q = torch.randn(1, 2, 32)
    kv = torch.randn(10, 32)
    with pytest.raises(ValueError, match="int32"):
        sparse_mla_decode(q, kv, torch.zeros(1, 4, dtype=torch.int64), 1.0, 32)
    with pytest.raises(ValueError, match="d_v"):
        sparse_mla_decode(q, kv, torch.zeros(1, 4, dtype=torch.int32), 1.0, 64)
    with pytest.raises(ValueError, match="variant"):
        sparse_mla_decode(q, kv, torch.zeros(1, 4, dtype=torch.int32), 1.0, 32, variant="x")
    assert sparse_mla.VARIANTS == ("reference", "naive", "splitkv", "fp8")
    with pytest.raises(ValueError, match="Fp8KVCache"):
        sparse_mla_decode(q, kv, torch.zeros(1, 4, dtype=torch.int32), 1.0, 32, variant="fp8")


# (D_qk, d_v, d_fp8, tile): V3.2-like (e4m3 = values, 16-bit score-only tail) and V4-like
# (e4m3 covers part of the values, the 16-bit rope part is the last value columns).
FP8_CASES = {"v32_like": (48, 32, 32, 16), "v4_like": (64, 64, 48, 16)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(FP8_CASES))
def test_fp8_cache_matches_its_dequantized_values(device, case):
    """The public call (default config: per-chunk scales), then the chunked kernel with 3
    splits, then the reshape path of the Triton kernel: each against the exact
    result on the dequantised cache. The chunked kernel never rounds a KV value (raw e4m3 is
    exact in 16 bits; scales multiply fp32 products), and rounds P x scale once like P, so the
    kv_rounded bound (which also allows rounding each value) covers both paths."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.fp8 import dequantize_kv, quantize_kv
    from servelab.kernels.sparse_mla.splitkv.geometry import SplitConfig

    d_qk, d_v, d_fp8, tile = FP8_CASES[case]
    dtypes = [torch.float16] if device == "cpu" else [torch.float16, torch.bfloat16]
    runs = [("public", None, None),
            ("chunked", SplitConfig(16, 16, 4, 1, kernel="triton_fp8_chunked"), 3),
            ("reshape", SplitConfig(16, 16, 4, 1, kernel="triton"), 2)]  # fmt: skip
    for dtype in dtypes:
        q, kv, idx = make(device, dtype, 2, 5, d_qk, 45, seed=9)
        idx[1] = -1  # all padding
        cache = quantize_kv(kv, d_fp8, tile)
        exact_kv = dequantize_kv(cache)  # fp32, exact products of e4m3 and fp32 scales
        b, h = q.shape[:2]
        out_ex, lse_ex, out_tol, lse_tol = bounds(
            q, exact_kv, idx, d_qk**-0.5, d_v, dtype, kv_rounded=True
        )
        for name, cfg, splits in runs:
            out, lse = poisoned(b, h, d_v, dtype, device)
            if cfg is None:
                o, lg = sparse_mla_decode(q, cache, idx, d_qk**-0.5, d_v, variant="fp8",
                                          out=out, lse=lse)  # fmt: skip
            else:
                run = splitkv_launch(q, cache, idx, d_qk**-0.5, d_v, num_splits=splits,
                                     config=cfg, out=out, lse=lse)  # fmt: skip
                o, lg = run.out, run.lse
                assert run.ran.variant == cfg.kernel, (name, run.ran)
            assert_close(f"fp8 {case} {name} {dtype} out", o, out_ex, out_tol)
            assert_close(f"fp8 {case} {name} {dtype} lse", lg, lse_ex, lse_tol)
            assert torch.all(o[1] == 0) and torch.all(torch.isneginf(lg[1]))


def test_fp8_quantizer_error_and_layout_bytes():
    """e4m3 keeps 3 mantissa bits: |x - dq(x)| <= 2^-4 |x| (normal range) + 2^-10 * scale
    (half the subnormal spacing, in units of the tile's scale)."""
    from servelab.kernels.sparse_mla.fp8 import dequantize_kv, quantize_kv

    kv = torch.randn(64, 576, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    kv[3, :128] *= 1e-3  # one tile with a tiny range: its own scale must keep it accurate
    cache = quantize_kv(kv, 512, 128)
    err = (dequantize_kv(cache) - kv.float())[:, :512].abs()
    scale = cache.scale.repeat_interleave(128, dim=1)
    assert torch.all(err <= 2.0**-4 * kv[:, :512].float().abs() + 2.0**-10 * scale)
    assert torch.equal(dequantize_kv(cache)[:, 512:], kv[:, 512:].float())
    # V3.2 layout: 512 e4m3 + 4 fp32 scales + 64 bf16 = 512 + 16 + 128 = 656 bytes.
    assert cache.bytes_per_token == 656
    # V4 layout: 448 e4m3 + 7 fp32 scales + 64 bf16 = 448 + 28 + 128 = 604 bytes.
    assert quantize_kv(kv[:, :512], 448, 64).bytes_per_token == 604


def _check_config(cfg, want_split, tag, q, kv, idx, d_v, ref):
    """One launch config against the exact result `ref` (from `bounds`), with the split kernel
    it must have run; outputs poisoned first."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch

    out_ex, lse_ex, out_tol, lse_tol = ref
    b, h, d_qk = q.shape
    out, lse = poisoned(b, h, d_v, q.dtype, q.device)
    run = splitkv_launch(q, kv, idx, d_qk**-0.5, d_v, config=cfg, out=out, lse=lse)
    assert run.ran.variant == want_split, run.ran
    assert_close(f"{tag} out", run.out, out_ex, out_tol)
    assert_close(f"{tag} lse", run.lse, lse_ex, lse_tol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "shape",
    [(2, 128, 576, 512, 2048), (1, 64, 512, 512, 640), (3, 128, 512, 512, 1152),
     (5, 16, 576, 512, 2048), (64, 32, 512, 512, 640), (4, 128, 576, 512, 2048),
     (8, 64, 512, 512, 640)],
    ids=["v32", "v4flash", "v4pro", "tp_h16", "tp_h32_b64", "v32_b4", "v4flash_b8"],
)  # fmt: skip
@pytest.mark.parametrize("variant", ["naive", "splitkv", "pdl", "rp", "fp8", "fp8_pdl",
                                     "fp8_reshape"])  # fmt: skip
def test_real_shapes_on_gpu(shape, variant):
    import dataclasses

    from servelab.kernels.sparse_mla.dispatch.defaults import default_config
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.dispatch.variants import VARIANTS
    from servelab.kernels.sparse_mla.fp8 import dequantize_kv, quantize_kv

    b, h, d_qk, d_v, topk = shape
    for dtype in (torch.bfloat16, torch.float16):
        q, kv, idx = make("cuda", dtype, b, h, d_qk, topk, t=70_000, pad_frac=0.05, seed=11)
        # The Triton kernels' own default (from B = 8, or 4 at 128 heads, the default is Gluon
        # on Hopper): the merge and FP8 variants test those kernels' geometry, not Gluon's.
        cfg = default_config(b, h, d_qk, gluon=False)
        if variant in ("rp", "pdl"):  # (the others derive their own bounds)
            ref = bounds(q, kv, idx, d_qk**-0.5, d_v, dtype)
            out_ex, lse_ex, out_tol, lse_tol = ref
        if variant == "rp":  # the register-prefetch kernel, both tile geometries
            for bh, warps in ((64, 8), (16, 4)) if h >= 64 else ((16, 4),):
                c = dataclasses.replace(cfg, block_h=bh, block_n=32, num_warps=warps,
                                        kernel="triton_rp", ctas_per_sm=1)  # fmt: skip
                _check_config(c, "triton_rp", f"rp {bh} {shape}", q, kv, idx, d_v, ref)
            continue
        if variant == "pdl":
            cfg = dataclasses.replace(cfg, merge=variant)
            for rep in range(2):
                out, lse = poisoned(b, h, d_v, dtype, "cuda")
                run = splitkv_launch(q, kv, idx, d_qk**-0.5, d_v, config=cfg, out=out, lse=lse)
                assert_close(f"{variant} {shape} rep {rep} out", run.out, out_ex, out_tol)
                assert_close(f"{variant} {shape} rep {rep} lse", run.lse, lse_ex, lse_tol)
                assert run.ran.merge in (variant, "single"), run.ran
            continue
        if not variant.startswith("fp8"):
            _run_and_check(variant, q, kv, idx, d_v)
            continue
        # V3.2: 512 e4m3 columns in 128-wide tiles; V4 (D_qk 512): 448 in 64-wide tiles.
        cache = quantize_kv(kv, 512, 128) if d_qk == 576 else quantize_kv(kv, 448, 64)
        cfg = None  # the defaults' choice (Gluon on Hopper)
        if variant == "fp8_pdl":  # the Triton FP8 default with the PDL merge
            cfg = dataclasses.replace(default_config(b, h, d_qk, fp8_tile=cache.tile,
                                                     gluon=False), merge="pdl")  # fmt: skip
        elif variant == "fp8_reshape":
            cfg = dataclasses.replace(default_config(b, h, d_qk, fp8_tile=cache.tile,
                                                     gluon=False), kernel="triton")  # fmt: skip
        run = splitkv_launch(q, cache, idx, d_qk**-0.5, d_v, config=cfg)
        assert VARIANTS[run.ran.variant].caches == ("fp8",) or run.ran.variant == "triton"
        assert cfg is None or run.ran.variant == cfg.kernel, run.ran
        out_ex, lse_ex, out_tol, lse_tol = bounds(
            q, dequantize_kv(cache), idx, d_qk**-0.5, d_v, dtype, kv_rounded=True,
            partial_rounded=partials_rounded(run.ran),
        )
        assert_close(f"fp8 {shape} out", run.out, out_ex, out_tol)
        assert_close(f"fp8 {shape} lse", run.lse, lse_ex, lse_tol)


def test_kernel_names_read_as_attention_in_a_profile():
    """`servelab profile` must put our own kernels in the attention category, not 'other' or
    'communication' (a name like `_combine_kernel` matches the all-to-all combine rule)."""
    from servelab.kernels.sparse_mla import naive
    from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common
    from servelab.kernels.sparse_mla.gluon_kernels import fp8 as gluon_fp8
    from servelab.kernels.sparse_mla.gluon_kernels import nh as gluon_nh
    from servelab.kernels.sparse_mla.gluon_kernels import ws as gluon_ws
    from servelab.kernels.sparse_mla.splitkv import merge
    from servelab.kernels.sparse_mla.triton_kernels import fp8_chunked as triton_fp8
    from servelab.kernels.sparse_mla.triton_kernels import rp as triton_rp
    from servelab.kernels.sparse_mla.triton_kernels import split as triton_split
    from servelab.profile.breakdown import load_rules

    rules = load_rules()
    kernels = [naive._sparse_mla_naive_kernel, triton_split._sparse_mla_split_kernel,
               merge._sparse_mla_merge_kernel, triton_fp8._sparse_mla_split_fp8_kernel,
               triton_rp._sparse_mla_split_rp_kernel]
    if gluon_common.AVAILABLE:
        kernels += [gluon_ws._sparse_mla_split_gluon_ws_kernel,
                    gluon_fp8._sparse_mla_split_gluon_fp8_kernel,
                    gluon_nh._sparse_mla_split_nh_kernel, gluon_nh._sparse_mla_split_nh_fp8_kernel]
    names = [f.fn.__name__ for f in kernels]
    assert [rules.classify(n) for n in names] == ["attention"] * len(names), names
