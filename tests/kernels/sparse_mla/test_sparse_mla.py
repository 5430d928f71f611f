"""Sparse MLA decode kernels against an exact (float64) reference, with the derived tolerances
of tests/lib/mla_check.py. Without CUDA the Triton kernels run in the interpreter with
fp16/fp32 inputs (bf16 tl.dot is wrong there); with CUDA everything runs compiled, bf16 and
the real-model shapes included. Kernel choice, fallbacks and graph replay:
dispatch/test_launch.py."""

from __future__ import annotations

import math

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
from servelab.kernels.sparse_mla import sparse_mla_decode

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
