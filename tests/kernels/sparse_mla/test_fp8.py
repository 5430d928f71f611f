"""The FP8 KV cache (fp8.py): the split kernel on it matches its dequantised values; the
quantiser's error and the layouts' bytes per token."""

from __future__ import annotations

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

from servelab.kernels.sparse_mla import sparse_mla_decode

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")

assert interpreted_kernels  # the module-scoped autouse fixture, imported to take effect here


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
