"""Search space as data: the engines' 1280 configs, the 18 batch sizes, and pruning."""

from __future__ import annotations

import itertools

from servelab.tune import space as S


def test_full_space_is_the_engines_1280():
    cfgs = S.enumerate_space("full")
    assert len(cfgs) == len(set(cfgs)) == 1280
    # every value of the engines' lists appears (SGLang/vLLM get_configs_compute_bound)
    assert {c.block_m for c in cfgs} == {16, 32, 64, 128, 256}
    assert {c.block_n for c in cfgs} == {32, 64, 128, 256}
    assert {c.block_k for c in cfgs} == {64, 128}
    assert {c.group_m for c in cfgs} == {1, 16, 32, 64}
    assert {c.num_warps for c in cfgs} == {4, 8}
    assert {c.num_stages for c in cfgs} == {2, 3, 4, 5}


def test_default_batch_sizes():
    assert S.DEFAULT_BATCH_SIZES == (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024,
                                     1536, 2048, 3072, 4096)


def test_engine_dict_round_trip():
    c = S.Config(64, 128, 128, 32, 4, 3)
    assert c.as_engine() == {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128,
                             "GROUP_SIZE_M": 32, "num_warps": 4, "num_stages": 3}
    assert S.Config.from_engine(c.as_engine()) == c
    assert c.key == "m64n128k128g32w4s3"


def test_shared_memory_and_register_predicates():
    lim = S.DeviceLimits(smem_bytes=232_448)
    # 5 stages x (256 + 256) x 128 fp8 bytes = 320 KiB > 227 KiB
    assert not S.fits_shared_memory(S.Config(256, 256, 128, 1, 8, 5), lim)
    assert S.fits_shared_memory(S.Config(128, 128, 128, 1, 4, 4), lim)       # 128 KiB
    assert S.smem_bytes(S.Config(64, 128, 128, 1, 4, 3)) == 3 * 192 * 128
    # accumulator registers per thread = BM*BN / (32 * warps)
    assert S.fits_registers(S.Config(128, 128, 64, 1, 4, 2), lim)           # 128
    assert not S.fits_registers(S.Config(128, 256, 64, 1, 4, 2), lim)       # 256
    assert S.fits_registers(S.Config(128, 256, 64, 1, 8, 2), lim)           # 128
    assert not S.fits_registers(S.Config(256, 256, 64, 1, 8, 2), lim)


def test_shape_predicate():
    assert not S.fits_shape(S.Config(128, 64, 64, 1, 4, 2), 4096, 512, m=1)    # BM > 64 for M=1
    assert S.fits_shape(S.Config(64, 64, 64, 1, 4, 2), 4096, 512, m=1)
    assert S.fits_shape(S.Config(256, 64, 64, 1, 4, 2), 4096, 512, m=200)
    assert not S.fits_shape(S.Config(16, 256, 64, 1, 4, 2), 100, 512, m=1)     # BN > 128 >= N


def _program_order(c: S.Config, m: int, n: int) -> list[tuple[int, int]]:
    """The kernel's pid -> (pid_m, pid_n) map, written out independently of the predicate."""
    npm, npn = -(-m // c.block_m), -(-n // c.block_n)
    out = []
    for pid in range(npm * npn):
        width = c.group_m * npn
        first = (pid // width) * c.group_m
        size = min(npm - first, c.group_m)
        out.append((first + pid % size, (pid % width) // size))
    return out


def test_group_pruning_keeps_exactly_one_config_per_program_order():
    n = 512
    for m in (1, 40, 300, 2048):
        groups = S.SPACES["full"]["GROUP_SIZE_M"]
        for bm, bn in itertools.product((16, 64, 256), (32, 128)):
            family = [S.Config(bm, bn, 128, g, 4, 3) for g in groups]
            kept = [c for c in family if S.canonical_group(c, m, groups)]
            orders = {tuple(_program_order(c, m, n)) for c in family}
            assert len(kept) == len(orders), (m, bm, bn)
            assert {tuple(_program_order(c, m, n)) for c in kept} == orders


def test_candidates_shrink_with_m_and_respect_every_predicate():
    lim = S.DeviceLimits()
    small, large = S.candidates(4096, 512, 1), S.candidates(4096, 512, 4096)
    assert 0 < len(small) < len(large) <= 1280
    for c in large:
        assert S.fits_shared_memory(c, lim) and S.fits_registers(c, lim)
    assert all(c.block_m <= 64 and c.group_m == 1 for c in small)
    assert S.Config(64, 128, 128, 32, 4, 3) in large          # the engines' default survives
