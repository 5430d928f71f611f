"""FP8 KV cache for sparse MLA decode: e4m3 values with per-tile fp32 scales, 16-bit rope.

Layout (a documented equivalent of FlashMLA's packed rows, kept as three tensors so each part
stays aligned and gathers with plain 16-byte loads):

- ``data``  [T, d_fp8] float8_e4m3fn: the first d_fp8 columns, each ``tile``-column tile of
  a row divided by its own scale;
- ``scale`` [T, d_fp8 / tile] fp32: amax(tile) / 448 (e4m3's largest finite value);
- ``rope``  [T, D_qk - d_fp8] in the query's dtype (bf16/fp16): kept exact, as FlashMLA does.

Bytes per token: V3.2 (d_fp8 512, tile 128, rope 64): 512 + 16 + 128 = 656, the same as
FlashMLA's layout. V4 (d_fp8 448, tile 64, rope 64): 448 + 28 + 128 = 604, 20 bytes over
FlashMLA's 584 because our scales are fp32 rather than 1-byte powers of two.

Two split-KV kernels read this layout directly (the layout is the same for both; no tile
change was needed):

- the reshape path (triton_kernels/split.py, ``FP8=True``) dequantises each gathered tile to the query's
  dtype in registers (through a reshape to [rows, tiles, tile]) and runs the same two
  tensor-core dots, so the values are exactly those of ``dequantize_kv`` rounded once to
  that dtype;
- the per-chunk path (triton_kernels/fp8_chunked.py) walks the e4m3 part in ``tile``-column chunks, casts the
  raw e4m3 values (exact in 16 bits) and folds each row's scale into the [H, rows] products
  (scores, and P before the P V dot), one accumulator per chunk.

On Hopper the Gluon kernels (gluon_kernels/fp8.py for 64-head blocks, gluon_kernels/nh.py for
<= 32 heads) gather the three parts into a shared-memory ring and dequantise each tile once
into an fp16 staging tile that both tensor-core dots read: e4m3 -> fp16 is exact, each value
is multiplied by its scale rounded to fp16 (one fp16 product), q and P are fp16 too. fp16 needs
the values in its range: |q|, the dequantised values (and on the V4 layout the rope) below
65504, or the dots see inf. Values and scales below 2^-14 (6.1e-5) are fp16 subnormals: a
value then carries an absolute error up to 2^-25 (plus up to 448 x 2^-25 from a subnormal
scale), not a relative one; tests/lib/mla_check.py's bound counts both.

The defaults file (defaults/h200.toml) picks one per shape and batch from the H200
measurements. None reaches the bf16 kernel's speed yet (0.53-0.98x on the H200, 2026-12-01;
docs/performance.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3_MAX = 448.0


@dataclass(frozen=True, slots=True)
class Fp8KVCache:
    """An FP8 latent KV cache (see the module docstring for the layout)."""

    data: torch.Tensor  # [T, d_fp8] float8_e4m3fn
    scale: torch.Tensor  # [T, d_fp8 // tile] fp32
    rope: torch.Tensor  # [T, D_qk - d_fp8] bf16 / fp16
    tile: int

    @property
    def d_fp8(self) -> int:
        return self.data.shape[1]

    @property
    def d_qk(self) -> int:
        return self.data.shape[1] + self.rope.shape[1]

    @property
    def bytes_per_token(self) -> int:
        return (
            self.d_fp8 * self.data.element_size()
            + self.scale.shape[1] * self.scale.element_size()
            + self.rope.shape[1] * self.rope.element_size()
        )


def quantize_kv(kv: torch.Tensor, d_fp8: int, tile: int = 128) -> Fp8KVCache:
    """Quantise a [T, D_qk] 16-bit cache: columns [0, d_fp8) to e4m3 per (row, tile)."""
    t, d_qk = kv.shape
    if d_fp8 % tile or not 0 < d_fp8 < d_qk:
        raise ValueError(f"d_fp8={d_fp8} must be a positive multiple of tile={tile} below {d_qk}")
    if tile < 16 or tile & (tile - 1):
        raise ValueError(f"tile must be a power of two >= 16, got {tile}")
    x = kv[:, :d_fp8].float().reshape(t, d_fp8 // tile, tile)
    amax = x.abs().amax(dim=-1).clamp(min=1e-12)  # [T, n_tiles]
    scale = amax / E4M3_MAX
    data = (x / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return Fp8KVCache(
        data=data.reshape(t, d_fp8).contiguous(),
        scale=scale.contiguous(),
        rope=kv[:, d_fp8:].contiguous(),
        tile=tile,
    )


def dequantize_kv(cache: Fp8KVCache) -> torch.Tensor:
    """The [T, D_qk] fp32 values the FP8 cache stands for (the tests' reference input)."""
    t = cache.data.shape[0]
    x = cache.data.float().reshape(t, -1, cache.tile) * cache.scale[..., None]
    return torch.cat([x.reshape(t, cache.d_fp8), cache.rope.float()], dim=1)
