"""Split-K block-FP8 GEMM (the opt-in SPLIT_K launch key) vs the fp64 reference, in Triton's
CPU interpreter.

Tolerance, derived as in test_kernel.py: fp8 x fp8 products are exact in fp32, so every error
is an fp32 rounding. A term of an output passes through at most BK - 1 additions inside its
step's dot, 2 scale multiplies, one accumulation per later step of its split, and at most
SPLIT_K additions when the partials are summed (workspace order or atomic order alike; the
first, 0 + p, is exact): n <= K + 3*ceil(K/BK) + 1 + SPLIT_K roundings, so
|err| <= gamma_n * sum|a b| with gamma_n = n u / (1 - n u), u = 2^-24, plus the final output
rounding (2^-8 relative for bf16, none for fp32 out).
"""

from __future__ import annotations

import math

import pytest
from interpreter import interpreter_or_skip

# The kernels run in Triton's CPU interpreter (tests/lib/interpreter.py says why a GPU machine
# skips these unless the process was started with TRITON_INTERPRET=1).
interpreter_or_skip("tests/kernels/fp8_gemm/test_kernel_split_k.py")

import torch  # noqa: E402

from servelab.kernels.fp8_gemm import reference as R  # noqa: E402

K_ = pytest.importorskip("servelab.kernels.fp8_gemm.kernel")

BASE = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4,
            num_stages=2)


def _inputs(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 3
    w = torch.randn(n, k, generator=g) * 0.02
    return R.quantize_per_token_group(x) + R.quantize_weight_per_block(w)


def _assert_within_bound(out: torch.Tensor, inputs, block_k: int, split_k: int) -> None:
    aq, as_, bq, bs = inputs
    ref = R.w8a8_block_matmul(aq, as_, bq, bs)
    k = aq.shape[1]
    n_round = k + 3 * math.ceil(k / block_k) + 1 + split_k
    u = 2.0 ** -24
    gamma = n_round * u / (1 - n_round * u)
    out_rel = {torch.bfloat16: 2.0 ** -8, torch.float32: 0.0}[out.dtype]
    bound = out_rel * ref.abs() + (1 + out_rel) * gamma * R.abs_matmul(aq, as_, bq, bs)
    assert not out.isnan().any(), f"{int(out.isnan().sum())} of {out.numel()} outputs never written"
    err = (out.double() - ref).abs()
    bad = (err > bound).nonzero()
    assert bad.numel() == 0, (f"SPLIT_K={split_k}: {bad.shape[0]} of {err.numel()} outside the "
                              f"bound, first at {bad[:3].tolist()}, max err {err.max():.3g}, "
                              f"max err/bound {(err / bound.clamp(min=1e-30)).max():.3g}")


def _run(inputs, cfg: dict, reduce: str = "workspace", dtype=torch.bfloat16) -> torch.Tensor:
    aq, as_, bq, bs = inputs
    out = torch.full((aq.shape[0], bq.shape[0]), float("nan"), dtype=dtype)   # poison
    return K_.w8a8_block_fp8_matmul(aq, as_, bq, bs, cfg, out=out, split_k_reduce=reduce)


# (M, N, K, config, [(SPLIT_K, reduction), ...]): M never a multiple of BLOCK_SIZE_M;
# K = 640 has 5 scale groups, so SPLIT_K 2, 3 do not divide them and 5 gives one group each;
# K = 200 ends in a partial group; BLOCK_SIZE_K 32 puts 4 steps in a group.
CASES = [
    (33, 160, 640, BASE, [(2, "workspace"), (3, "workspace"), (5, "workspace"), (3, "atomic")]),
    (20, 96, 200, dict(BASE, BLOCK_SIZE_M=32, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=4),
     [(2, "workspace"), (2, "atomic")]),
    (1, 64, 384, dict(BASE, BLOCK_SIZE_K=32), [(2, "workspace"), (3, "atomic")]),
]


class _GridSpy:
    """Stands in for a Triton kernel: records each launch grid, then launches the real one."""

    def __init__(self, kernel) -> None:
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("m,n,k,cfg,splits", CASES, ids=["m33k640", "m20k200", "m1k384"])
def test_split_k_within_the_derived_bound(m, n, k, cfg, splits, monkeypatch):
    spy = _GridSpy(K_._w8a8_block_fp8_matmul_splitk)
    monkeypatch.setattr(K_, "_w8a8_block_fp8_matmul_splitk", spy)
    inputs = _inputs(m, n, k, seed=7 * m + n + k)
    tiles = math.ceil(m / cfg["BLOCK_SIZE_M"]) * math.ceil(n / cfg["BLOCK_SIZE_N"])
    for split_k, reduce in splits:
        out = _run(inputs, dict(cfg, SPLIT_K=split_k), reduce)
        _assert_within_bound(out, inputs, cfg["BLOCK_SIZE_K"], split_k)
        assert spy.grids[-1] == (tiles, split_k), f"launched {spy.grids}, not the split grid"
    assert len(spy.grids) == len(splits)


def test_split_k_fp32_output_is_tight_and_deterministic():
    """fp32 out drops the bf16 rounding that would hide a wrong partial sum; the workspace
    reduction sums in a fixed order, so a second call gives the same bits."""
    inputs = _inputs(17, 96, 640, seed=11)
    cfg = dict(BASE, SPLIT_K=3)
    out = _run(inputs, cfg, dtype=torch.float32)
    _assert_within_bound(out, inputs, cfg["BLOCK_SIZE_K"], 3)
    assert torch.equal(out, _run(inputs, cfg, dtype=torch.float32))


def test_split_k_1_is_the_engines_kernel(monkeypatch):
    """SPLIT_K = 1 (or absent) runs the engines' one-pass kernel: same bits, no split-K launch."""
    inputs = _inputs(21, 96, 384, seed=5)

    def no_split(*_a, **_k):
        raise AssertionError("SPLIT_K=1 must not take the split-K path")
    without = _run(inputs, BASE)
    monkeypatch.setattr(K_, "_launch_split_k", no_split)
    for dtype in (torch.bfloat16, torch.float32):
        assert torch.equal(_run(inputs, dict(BASE, SPLIT_K=1), dtype=dtype),
                           _run(inputs, BASE, dtype=dtype))
    assert torch.equal(_run(inputs, dict(BASE, SPLIT_K=1)), without)
    _assert_within_bound(without, inputs, BASE["BLOCK_SIZE_K"], 1)


def test_bad_split_k_values_are_rejected_with_a_reason():
    aq, as_, bq, bs = _inputs(4, 64, 384, seed=0)       # 3 scale groups along K
    for bad in (0, -2, 2.0, True, "2", None):
        with pytest.raises(ValueError, match="must be an int >= 1"):
            K_.check_config(dict(BASE, SPLIT_K=bad))
    with pytest.raises(ValueError, match="BLOCK_SIZE_K <= 128"):
        K_.w8a8_block_fp8_matmul(aq, as_, bq, bs, dict(BASE, BLOCK_SIZE_K=256, SPLIT_K=2))
    with pytest.raises(ValueError, match="exceeds the 3 scale groups"):
        K_.w8a8_block_fp8_matmul(aq, as_, bq, bs, dict(BASE, SPLIT_K=4))
    with pytest.raises(ValueError, match="split_k_reduce"):
        K_.w8a8_block_fp8_matmul(aq, as_, bq, bs, dict(BASE, SPLIT_K=2), split_k_reduce="tree")
    # the engines' configs (no SPLIT_K) and a 256-wide K step without a split stay valid
    K_.check_config(dict(BASE, BLOCK_SIZE_K=256))


def test_reduce_sums_partials_in_order_then_rounds():
    """The reduction alone: the same bits as torch's fp32 sum p0 + p1 + ... taken left to right
    (0 + p0 is exact), then one round-to-nearest-even cast; N not a multiple of its block,
    a strided output."""
    g = torch.Generator().manual_seed(3)
    parts = torch.randn(3, 5, 700, generator=g) * torch.logspace(-4, 4, 700)
    ordered = (parts[0] + parts[1]) + parts[2]
    out32 = torch.full((5, 700), float("nan"))
    assert torch.equal(K_.splitk_reduce(parts, out32), ordered)
    wide = torch.full((5, 1400), float("nan"), dtype=torch.bfloat16)
    out16 = K_.splitk_reduce(parts, wide[:, ::2])
    assert torch.equal(out16, ordered.to(torch.bfloat16))
    assert wide[:, 1::2].isnan().all(), "wrote outside the strided output"
    with pytest.raises(ValueError, match="contiguous fp32"):
        K_.splitk_reduce(parts.double(), out32)


def test_caller_workspace_contents_do_not_matter():
    """A caller's buffer (as a CUDA graph would hold) full of NaN: the partials overwrite all of
    it (workspace) or it is zeroed first (atomic); too small or not fp32 is refused."""
    inputs = _inputs(19, 96, 384, seed=13)
    aq, as_, bq, bs = inputs
    cfg = dict(BASE, SPLIT_K=3)
    own = _run(inputs, cfg)
    for reduce in K_.SPLIT_K_REDUCTIONS:
        need = K_.split_k_workspace_numel(19, 96, 3, reduce)
        assert need == (3 if reduce == "workspace" else 1) * 19 * 96
        ws = torch.full((need + 5,), float("nan"))
        out = K_.w8a8_block_fp8_matmul(aq, as_, bq, bs, cfg, split_k_reduce=reduce, workspace=ws)
        _assert_within_bound(out, inputs, cfg["BLOCK_SIZE_K"], 3)
        if reduce == "workspace":
            assert torch.equal(out, own)
        with pytest.raises(ValueError, match=f">= {need} elements"):
            K_.w8a8_block_fp8_matmul(aq, as_, bq, bs, cfg, split_k_reduce=reduce,
                                     workspace=ws[: need - 1])
    with pytest.raises(ValueError, match="contiguous fp32"):
        K_.w8a8_block_fp8_matmul(aq, as_, bq, bs, cfg, workspace=torch.zeros(3 * 19 * 96,
                                                                             dtype=torch.float64))
