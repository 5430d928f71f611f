"""flops() and bytes() (counts.py) against hand counts at the real shapes."""

from __future__ import annotations

from servelab.kernels.sparse_mla.counts import bytes as mla_bytes
from servelab.kernels.sparse_mla.counts import flops


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
