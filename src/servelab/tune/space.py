"""The block-FP8 GEMM search space as data, and the predicates that prune it.

The full space is SGLang's (and vLLM's) tuning space, 5 x 4 x 2 x 4 x 2 x 4 = 1280 configs.
Pruning keeps only configs that can compile and can matter for a given (N, K, M):
shared memory and registers of the device, block sizes against the shape, and GROUP_SIZE_M
values that give the same program order (they launch identical work).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024,
                                        1536, 2048, 3072, 4096)

# Each space: parameter -> values. "full" is the engines' 1280; "tiny" is for Triton's CPU
# interpreter (tests, CI), where only the pipeline is exercised and timings mean nothing.
SPACES: dict[str, dict[str, tuple[int, ...]]] = {
    "full": {
        "BLOCK_SIZE_M": (16, 32, 64, 128, 256),
        "BLOCK_SIZE_N": (32, 64, 128, 256),
        "BLOCK_SIZE_K": (64, 128),
        "GROUP_SIZE_M": (1, 16, 32, 64),
        "num_warps": (4, 8),
        "num_stages": (2, 3, 4, 5),
    },
    "tiny": {
        "BLOCK_SIZE_M": (16, 32),
        "BLOCK_SIZE_N": (32, 64),
        "BLOCK_SIZE_K": (64, 128),
        "GROUP_SIZE_M": (1, 4),
        "num_warps": (4,),
        "num_stages": (2,),
    },
}


@dataclass(frozen=True, slots=True, order=True)
class Config:
    """One launch config of the block-FP8 GEMM: the engines' six keys, plus SGLang's Hopper
    keys (SPLIT_K, SWAP_AB; read on sm90 only) and any compiler hints an engine file carried
    (`hints`, e.g. ROCm's waves_per_eu), so a config read from a shipped file is launched and
    written back as it was. num_stages None: the file left it to Triton's default."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int | None
    split_k: int = 1
    swap_ab: bool = False
    hints: tuple[tuple[str, int], ...] = ()

    def as_engine(self) -> dict[str, int | bool]:
        """The engines' JSON entry (SPLIT_K / SWAP_AB only when they differ from the default)."""
        d: dict[str, int | bool] = {"BLOCK_SIZE_M": self.block_m, "BLOCK_SIZE_N": self.block_n,
                                    "BLOCK_SIZE_K": self.block_k, "GROUP_SIZE_M": self.group_m,
                                    "num_warps": self.num_warps}
        if self.num_stages is not None:
            d["num_stages"] = self.num_stages
        if self.split_k != 1:
            d["SPLIT_K"] = self.split_k
        if self.swap_ab:
            d["SWAP_AB"] = True
        d.update(dict(self.hints))
        return d

    @classmethod
    def from_engine(cls, d: Mapping[str, int | bool]) -> Config:
        """From an engine file's entry, every key kept (see kernels/fp8_gemm/formats.py)."""
        skip = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
                "num_stages", "SPLIT_K", "SWAP_AB"}
        stages = d.get("num_stages")
        return cls(int(d["BLOCK_SIZE_M"]), int(d["BLOCK_SIZE_N"]), int(d["BLOCK_SIZE_K"]),
                   int(d["GROUP_SIZE_M"]), int(d["num_warps"]),
                   None if stages is None else int(stages), int(d.get("SPLIT_K", 1)),
                   bool(d.get("SWAP_AB", False)),
                   tuple(sorted((k, int(v)) for k, v in d.items() if k not in skip)))

    @property
    def stages(self) -> int:
        """num_stages as launched: Triton's CUDA default (3) where the file gave none."""
        return 3 if self.num_stages is None else self.num_stages

    @property
    def key(self) -> str:
        """Compact stable id, e.g. 'm64n128k128g32w4s3' ('s-' where num_stages is left to
        Triton, then 'k2' split-K, 'x' swapped A/B, and any hints)."""
        s = "-" if self.num_stages is None else str(self.num_stages)
        out = f"m{self.block_m}n{self.block_n}k{self.block_k}g{self.group_m}w{self.num_warps}s{s}"
        if self.split_k != 1:
            out += f"sk{self.split_k}"
        if self.swap_ab:
            out += "x"
        return out + "".join(f"_{k}{v}" for k, v in self.hints)


@dataclass(frozen=True, slots=True)
class DeviceLimits:
    """What a device allows one program: shared memory and registers per thread."""

    smem_bytes: int = 232_448        # H100/H200: 227 KiB opt-in per block
    regs_per_thread: int = 255
    # The fp32 accumulator and the dot's fp32 result each hold BM*BN/(32*warps) registers per
    # thread; at most 128 each keeps both within the 255 with little room to spare.
    acc_regs_max: int = 128


def enumerate_space(name: str = "full") -> list[Config]:
    """Every config of the named space, in a fixed order."""
    if name not in SPACES:
        raise ValueError(f"unknown space {name!r}; known: {', '.join(SPACES)}")
    s = SPACES[name]
    return [Config(*vals) for vals in itertools.product(
        s["BLOCK_SIZE_M"], s["BLOCK_SIZE_N"], s["BLOCK_SIZE_K"], s["GROUP_SIZE_M"],
        s["num_warps"], s["num_stages"])]


def smem_bytes(c: Config) -> int:
    """Shared memory of the software pipeline: num_stages copies of the fp8 A and B tiles."""
    return c.stages * (c.block_m + c.block_n) * c.block_k


def fits_shared_memory(c: Config, lim: DeviceLimits) -> bool:
    return smem_bytes(c) <= lim.smem_bytes


def fits_registers(c: Config, lim: DeviceLimits) -> bool:
    acc = c.block_m * c.block_n // (32 * c.num_warps)
    return acc <= min(lim.acc_regs_max, lim.regs_per_thread)


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def fits_shape(c: Config, n: int, k: int, m: int) -> bool:
    """Tiles no larger than the problem needs: BLOCK_SIZE_M up to max(64, M rounded up to a power
    of two) (64 rows is one Hopper warpgroup MMA), BLOCK_SIZE_N/K no larger than N/K rounded up."""
    return (c.block_m <= max(64, _pow2_at_least(m)) and c.block_n <= max(32, _pow2_at_least(n))
            and c.block_k <= max(64, _pow2_at_least(k)))


def canonical_group(c: Config, m: int, group_values: Iterable[int]) -> bool:
    """True for the one representative of configs that differ only in GROUP_SIZE_M and launch the
    same program order: the order depends on min(GROUP_SIZE_M, cdiv(M, BLOCK_SIZE_M)) only."""
    pid_m = -(-m // c.block_m)
    eff = min(c.group_m, pid_m)
    return c.group_m == min(g for g in group_values if min(g, pid_m) == eff)


def candidates(n: int, k: int, m: int, space: str = "full",
               limits: DeviceLimits | None = None) -> list[Config]:
    """The pruned configs worth timing for an (M, N, K) GEMM."""
    lim = limits or DeviceLimits()
    groups = SPACES[space]["GROUP_SIZE_M"]
    return [c for c in enumerate_space(space)
            if fits_shared_memory(c, lim) and fits_registers(c, lim) and fits_shape(c, n, k, m)
            and canonical_group(c, m, groups)]


def device_limits() -> DeviceLimits:
    """Limits of the current CUDA device (torch), or the H200's where there is none."""
    try:
        import torch
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(torch.cuda.current_device())
            smem = getattr(p, "shared_memory_per_block_optin", None) or DeviceLimits.smem_bytes
            return DeviceLimits(smem_bytes=int(smem))
    except ImportError:
        pass
    return DeviceLimits()
