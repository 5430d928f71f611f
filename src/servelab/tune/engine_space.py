"""The search space of an engine's own block-FP8 launcher, as data: a generator and pruning
predicates for a coarse first stage, and local moves for a refining second stage.

Against servelab's six-key space (space.py) it adds what SGLang's launcher reads on sm90:
SPLIT_K (K split over 2-8 programs per tile, fp32 partials reduced by a second kernel) and
SWAP_AB (the weight tile on the MMA's M side, so a 16-row activation tile still feeds a
64-row Hopper wgmma). Both only help when there are too few output tiles for the SMs, i.e.
at decode sizes; elsewhere they are pruned.
"""

from __future__ import annotations

from dataclasses import replace

from servelab.tune.space import Config, DeviceLimits, fits_registers, fits_shared_memory

SPLITS = (1, 2, 4, 8)
STAGES = (3, 4, 5)
WARPS = (4, 8)
GROUPS = (1, 16, 32, 64)


def _pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def tiles(n: int, m: int, c: Config) -> int:
    """Output tiles (programs before any split) of an (M, N) output."""
    return -(-m // c.block_m) * -(-n // c.block_n)


def block_ms(m: int) -> tuple[int, ...]:
    """Row-tile heights worth trying: from a quarter of M (at least 16, at most 64) up to M
    rounded to a power of two (at most 256), plus 64 (one Hopper warpgroup MMA) at small M."""
    p = _pow2(m)
    lo, hi = max(16, min(64, p // 4)), min(256, max(16, p))
    out = [b for b in (16, 32, 64, 128, 256) if lo <= b <= hi]
    if m <= 64 and 64 not in out:
        out.append(64)
    return tuple(out)


def keep(c: Config, n: int, k: int, m: int, sms: int, hopper: bool, lim: DeviceLimits) -> bool:
    """The pruning predicate: compiles within the device's limits, and split/swap only where
    the launcher honours them (sm90) and they can matter (fewer tiles than SMs)."""
    if not (fits_shared_memory(c, lim) and fits_registers(c, lim)):
        return False
    if c.block_n > max(32, _pow2(n)):
        return False
    if c.swap_ab and not (hopper and c.block_m <= 32 and c.block_n >= 64):
        return False
    if c.split_k > 1:
        groups_k = -(-k // 128)
        t = tiles(n, m, c)
        if not hopper or t >= sms or groups_k // c.split_k < 2 or t * c.split_k > 4 * sms:
            return False
    return True


def _canon_group(c: Config, m: int) -> Config:
    """GROUP_SIZE_M only orders programs when there are several row tiles: collapse it."""
    return replace(c, group_m=1) if -(-m // c.block_m) == 1 else c


def stage1(n: int, k: int, m: int, sms: int, hopper: bool,
           lim: DeviceLimits | None = None) -> list[Config]:
    """Coarse candidates: every tile shape x split x swap, with the usual warps / stages."""
    lim = lim or DeviceLimits()
    out: dict[Config, None] = {}
    for bm in block_ms(m):
        for bn in ((32, 64, 128, 256) if m < 256 else (64, 128, 256)):
            warps = 4 if bm * bn <= 64 * 128 else 8
            for sk in SPLITS:
                for sw in (False, True):
                    for st in (4, 3):
                        c = _canon_group(Config(bm, bn, 128, 16, warps, st, sk, sw), m)
                        if keep(c, n, k, m, sms, hopper, lim):
                            out[c] = None
                            break                      # 4 stages, or 3 where 4 does not fit
    return list(out)


def refine(c: Config, n: int, k: int, m: int, sms: int, hopper: bool,
           lim: DeviceLimits | None = None) -> list[Config]:
    """Local moves around a good config: stages, warps, GROUP_SIZE_M, split one step."""
    lim = lim or DeviceLimits()
    moves = [replace(c, num_stages=s) for s in STAGES]
    moves += [replace(c, num_warps=w) for w in WARPS]
    moves += [replace(c, group_m=g) for g in GROUPS]
    i = SPLITS.index(c.split_k) if c.split_k in SPLITS else 0
    moves += [replace(c, split_k=SPLITS[j]) for j in (i - 1, i + 1) if 0 <= j < len(SPLITS)]
    out = dict.fromkeys(_canon_group(x, m) for x in moves)
    return [x for x in out if x != c and keep(x, n, k, m, sms, hopper, lim)]
