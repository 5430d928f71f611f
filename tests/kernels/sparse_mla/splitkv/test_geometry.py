"""The split count (splitkv/geometry.py): fills the machine, never an empty split."""

from __future__ import annotations

import math


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
