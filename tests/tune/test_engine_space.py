"""The engines' extra search dimensions (split-K, swapped A/B): only where they can help."""

from __future__ import annotations

from servelab.tune import engine_space


def test_engine_space_splits_and_swaps_only_where_they_can_help():
    small = engine_space.stage1(1024, 4096, 1, sms=132, hopper=True)
    assert any(c.split_k > 1 for c in small) and any(c.swap_ab for c in small)
    assert all(c.block_m <= 32 for c in small if c.swap_ab)
    big = engine_space.stage1(18432, 7168, 4096, sms=132, hopper=True)
    assert big and not any(c.split_k > 1 or c.swap_ab for c in big)
    not_hopper = engine_space.stage1(1024, 4096, 1, sms=132, hopper=False)
    assert not any(c.split_k > 1 or c.swap_ab for c in not_hopper)
    for c in small:
        for r in engine_space.refine(c, 1024, 4096, 1, 132, True):
            assert engine_space.keep(r, 1024, 4096, 1, 132, True, engine_space.DeviceLimits())
