"""The merge of split partials (splitkv/merge.py): the merge kernel against a float64 merge, its
geometry checks, the PDL merge and the per-program trace; tolerances of tests/lib/mla_check.py."""

from __future__ import annotations

import math

import pytest
import torch
from mla_check import (
    DEVICES,
    assert_close,
    bounds,
    interpreted_kernels,
    make,
    poisoned,
)

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")

assert interpreted_kernels  # the module-scoped autouse fixture, imported to take effect here


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
