"""Block-FP8 GEMM kernel vs the fp64 reference, in Triton's CPU interpreter.

Tolerances are derived, not tuned: fp8 x fp8 products are exact in fp32, so the kernel's only
errors are fp32 rounding of sums and scale multiplies (at most n = K + 3*ceil(K/BK) + 1
roundings per output, bounded by gamma_n * sum|a b| with gamma_n = n u / (1 - n u),
u = 2^-24) and the final bf16 rounding (at most 2^-8 relative, round to nearest).
"""

from __future__ import annotations

import math

import pytest
from interpreter import interpreter_or_skip

# The kernels run in Triton's CPU interpreter (tests/lib/interpreter.py says why a GPU machine
# skips these unless the process was started with TRITON_INTERPRET=1).
interpreter_or_skip("tests/kernels/fp8_gemm/test_kernel.py")

import torch  # noqa: E402

from servelab.kernels.fp8_gemm import configs as C  # noqa: E402
from servelab.kernels.fp8_gemm import reference as R  # noqa: E402

K_ = pytest.importorskip("servelab.kernels.fp8_gemm.kernel")

CFGS = [
    dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=2),
    dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=4, num_warps=4, num_stages=3),
    dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=32, num_warps=4, num_stages=3),
    dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=8, num_stages=2),
]


def _inputs(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 2
    w = torch.randn(n, k, generator=g) * 0.05
    return R.quantize_per_token_group(x) + R.quantize_weight_per_block(w)


def _assert_within_bound(out: torch.Tensor, aq, as_, bq, bs, block_k: int) -> None:
    ref = R.w8a8_block_matmul(aq, as_, bq, bs)
    k = aq.shape[1]
    n_round = k + 3 * math.ceil(k / block_k) + 1
    u = 2.0 ** -24
    gamma = n_round * u / (1 - n_round * u)
    bound = 2.0 ** -8 * ref.abs() + (1 + 2.0 ** -8) * gamma * R.abs_matmul(aq, as_, bq, bs)
    assert not out.isnan().any(), f"{int(out.isnan().sum())} outputs never written"
    err = (out.double() - ref).abs()
    bad = (err > bound).nonzero()
    assert bad.numel() == 0, (f"{bad.shape[0]} of {err.numel()} outside the bound, first at "
                              f"{bad[:3].tolist()}, max err {err.max():.3g}, "
                              f"max err/bound {(err / bound.clamp(min=1e-30)).max():.3g}")


@pytest.mark.parametrize("m,n,k", [(5, 256, 256), (33, 160, 200), (1, 128, 128), (70, 96, 320)])
def test_gemm_matches_reference_for_every_config(m, n, k):
    aq, as_, bq, bs = _inputs(m, n, k, seed=m + n + k)
    for cfg in CFGS:
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)     # poison: every element written
        K_.w8a8_block_fp8_matmul(aq, as_, bq, bs, cfg, out=out)
        _assert_within_bound(out, aq, as_, bq, bs, cfg["BLOCK_SIZE_K"])


def test_geometry_only_change_is_bit_identical():
    """Configs with the same BLOCK_SIZE_K sum in the same order: identical bits. A different
    BLOCK_SIZE_K regroups the fp32 sums (only the bound holds), checked above."""
    m, n, k = 37, 192, 384
    aq, as_, bq, bs = _inputs(m, n, k, seed=3)
    by_bk: dict[int, list[torch.Tensor]] = {}
    for cfg in CFGS + [dict(CFGS[2], BLOCK_SIZE_M=32, BLOCK_SIZE_N=32, GROUP_SIZE_M=1)]:
        by_bk.setdefault(cfg["BLOCK_SIZE_K"], []).append(K_.w8a8_block_fp8_matmul(aq, as_, bq, bs, cfg))
    for outs in by_bk.values():
        assert len(outs) >= 2
        for o in outs[1:]:
            assert torch.equal(o, outs[0])


def test_quant_kernel_is_bit_exact_with_reference():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 300, generator=g) * torch.logspace(-3, 3, 9)[:, None]
    x[0, :128] = 0.0            # an all-zero group: finite scale, zeros out
    x[1, 5] = 1e-12             # far below its group's absmax: fp8 subnormal / zero
    q, s = K_.per_token_group_quant(x)
    rq, rs = R.quantize_per_token_group(x)
    assert torch.equal(s, rs)
    diff = (q.view(torch.uint8) != rq.view(torch.uint8)).nonzero()
    assert diff.numel() == 0, f"{diff.shape[0]} codes differ, first {diff[:3].tolist()}"
    assert s.shape == (9, 3) and q.dtype == R.FP8_DTYPE


def test_linear_quantizes_then_multiplies():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 256, generator=g)
    bq, bs = R.quantize_weight_per_block(torch.randn(128, 256, generator=g))
    aq, as_ = R.quantize_per_token_group(x)
    out = K_.w8a8_block_fp8_linear(x, bq, bs, CFGS[0])
    assert torch.equal(out, K_.w8a8_block_fp8_matmul(aq, as_, bq, bs, CFGS[0]))


def test_launcher_rejects_bad_input_with_a_reason():
    aq, as_, bq, bs = _inputs(4, 128, 128, seed=0)
    with pytest.raises(ValueError, match="lacks"):
        K_.w8a8_block_fp8_matmul(aq, as_, bq, bs, {"BLOCK_SIZE_M": 16})
    with pytest.raises(ValueError, match="power of two"):
        K_.w8a8_block_fp8_matmul(aq, as_, bq, bs, dict(CFGS[0], BLOCK_SIZE_N=48))
    with pytest.raises(ValueError, match="scales"):
        K_.w8a8_block_fp8_matmul(aq, as_[:, :0], bq, bs, CFGS[0])


def test_flops_and_bytes_count_the_tensors():
    m, n, k = 3, 200, 300
    aq, as_, bq, bs = _inputs(m, n, k, seed=0)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    tensors = (aq, as_, bq, bs, out)
    assert R.bytes_moved(m, n, k) == sum(t.numel() * t.element_size() for t in tensors)
    assert R.bytes(m, n, k) == R.bytes_moved(m, n, k)
    assert R.weight_bytes(n, k) == bq.numel() + bs.numel() * 4
    # one multiply and one add per term of C[i, j] = sum_l A[i, l] B[j, l]
    assert R.flops(m, n, k) == 2 * sum(1 for _ in range(m) for _ in range(n)) * k


def _engine_pick(entries: dict, m: int) -> dict:
    # SGLang / vLLM: configs[min(configs.keys(), key=lambda x: abs(x - M))]
    return entries[min(entries.keys(), key=lambda x: abs(x - m))]


def test_nearest_m_lookup_matches_the_engines(tmp_path):
    from servelab.kernels.fp8_gemm import formats
    entries = {1: dict(CFGS[0]), 16: dict(CFGS[1]), 64: dict(CFGS[2]), 4096: dict(CFGS[3])}
    for m in [1, 2, 8, 9, 20, 40, 63, 100, 2000, 2080, 99999]:
        assert C.nearest(entries, m) == _engine_pick(entries, m), m
    rev = dict(reversed(list(entries.items())))          # ties go to the first key in file order
    assert C.nearest(rev, 40) == _engine_pick(rev, 40) == CFGS[2]
    p = tmp_path / formats.config_file_name("sglang", 4096, 512, "NVIDIA H200")
    formats.merge_write_config(p, entries)
    assert C.lookup(tmp_path, 4096, 512, 20, "NVIDIA H200") == CFGS[1]
    assert C.lookup(tmp_path, 4096, 512, 20, "NVIDIA H200", engine="vllm") == C.default_config("vllm")


def test_defaults_when_no_file(tmp_path):
    sg = C.lookup(tmp_path, 1024, 4096, 7, "NVIDIA H200")
    vl = C.lookup(None, 1024, 4096, 7, "NVIDIA H200", engine="vllm")
    assert sg == {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
                  "num_warps": 4, "num_stages": 3}
    assert vl == dict(sg, num_stages=2)
