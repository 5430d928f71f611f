"""Searches against a synthetic cost landscape whose optimum is known."""

from __future__ import annotations

import math

from servelab.tune import search, space
from servelab.tune.timing import Measurement


def _landscape(opt: space.Config):
    """A smooth cost: log-distance from `opt` per parameter, plus a few failing configs."""
    def cost(c: space.Config) -> float | None:
        if c.block_m == 256 and c.block_n == 256:
            return None                                        # "out of resources"
        d = sum(abs(math.log2(getattr(c, f) / getattr(opt, f)))
                for f in ("block_m", "block_n", "block_k", "num_warps"))
        d += 0.3 * abs(c.num_stages - opt.num_stages) + 0.05 * abs(math.log2(c.group_m / opt.group_m))
        return 10.0 * (1 + 0.1 * d)
    return cost


def _measure_fn(cost, m: int, calls: list):
    def measure(configs, reps):
        calls.append((list(configs), reps))
        out = []
        for c in configs:
            t = cost(c)
            out.append(Measurement(4096, 512, m, c, t, 0.0 if t else None, reps if t else 0,
                                   None if t else "OutOfResources"))
        return out
    return measure


def test_exhaustive_finds_the_optimum_and_notes_failures():
    m = 512
    opt = space.Config(128, 64, 128, 16, 4, 3)
    cands = space.candidates(4096, 512, m)
    calls: list = []
    res = search.exhaustive(cands, _measure_fn(_landscape(opt), m, calls))
    assert res.best == opt
    assert res.timed == len(cands) and res.failed == sum(c.block_m == c.block_n == 256 for c in cands)


def test_fast_stays_in_budget_and_finds_a_near_optimum():
    for m, opt in [(1, space.Config(16, 64, 128, 1, 4, 4)), (64, space.Config(64, 128, 64, 1, 8, 3)),
                   (4096, space.Config(128, 128, 128, 16, 8, 4))]:
        cands = space.candidates(4096, 512, m)
        assert opt in cands
        calls: list = []
        cost = _landscape(opt)
        res = search.fast(cands, _measure_fn(cost, m, calls), m, budget_frac=0.2)
        distinct = {c for cfgs, _ in calls for c in cfgs}
        assert len(distinct) == res.timed <= int(0.2 * len(cands))
        assert cost(res.best) <= 1.03 * cost(opt), (m, res.best, opt)


def test_fast_warm_start_is_used():
    m = 96
    opt = space.Config(32, 256, 64, 1, 8, 5)                 # far from the prior's favourites
    cands = space.candidates(4096, 512, m)
    calls: list = []
    hint = space.Config(32, 256, 64, 64, 8, 5)               # maps to its canonical GROUP_SIZE_M
    res = search.fast(cands, _measure_fn(_landscape(opt), m, calls), m, hints=[hint, opt])
    assert opt in calls[0][0]                                # timed in the first round
    assert res.best == opt


def test_fast_is_deterministic_for_a_seed():
    m = 256
    cands = space.candidates(4096, 512, m)
    cost = _landscape(space.Config(64, 64, 128, 16, 4, 3))
    a, b = [], []
    search.fast(cands, _measure_fn(cost, m, a), m, seed=7)
    search.fast(cands, _measure_fn(cost, m, b), m, seed=7)
    assert a == b


def test_default_is_always_in_the_final_comparison():
    """Never pick a config that measured slower than the engine default at the same time."""
    m = 4096
    default = space.Config(64, 128, 128, 32, 4, 3)
    cands = space.candidates(4096, 512, m)
    calls: list = []
    res = search.fast(cands, _measure_fn(_landscape(default), m, calls), m, default=default)
    assert default in calls[-1][0] and calls[-1][1] == search.HIGH_REPS
    assert res.best == default
    calls = []
    res = search.exhaustive(cands, _measure_fn(_landscape(default), m, calls), default=default)
    assert res.best == default and default in calls[-1][0]
