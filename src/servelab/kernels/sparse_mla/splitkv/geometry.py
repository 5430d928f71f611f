"""Launch geometry of the split-KV kernels: `SplitConfig`, the split count and the merge.

A config names the variant that runs it (``kernel``, a key of variants.VARIANTS) and its tile
geometry. The geometries the defaults use are data (defaults/<gpu>.toml, `[geometry.*]`), read
by dispatch/defaults.py; nothing here is a measured choice except what the data file passes in.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

MAX_SPLITS = 256  # the merge kernel loads all partials of a column slice at once
MERGES = ("auto", "kernel", "pdl")
# The variants' names (dispatch/variants.py holds what each serves and how it launches).
KERNELS = ("triton", "triton_rp", "triton_fp8_chunked", "gluon_ws", "gluon_fp8", "gluon_nh",
           "gluon_nh_fp8")  # fmt: skip


@dataclass(frozen=True, slots=True)
class SplitConfig:
    """Launch geometry of one split kernel. Tile sizes and the split count set the order of
    the fp32 online-softmax accumulation and the merge, so two configs agree within the
    derived tolerance, not bit for bit; the tests check each against the exact result."""

    block_h: int = 64
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 2  # Triton: pipeline stages; Gluon: ring depth / K buffers
    # Programs one SM holds at once with this geometry at the real shapes (compiler report on
    # the H200: 64-head tiles use 243-255 registers x 256 threads and 197-221 KB shared
    # memory -> 1; 16-head, 32-token tiles 128-191 registers x 128 threads, 50-93 KB -> 2+).
    ctas_per_sm: int = 1
    waves: float = 1.0  # target programs = waves x ctas_per_sm x SMs
    min_tiles_per_split: int = 1
    prefetch_idx: bool = True  # (triton) load tile t+1's indices during tile t
    # "kernel" (a second launch), "pdl" (second launch, programmatic dependent) or "auto"
    # (pdl or kernel by how full the split grid is: `resolve_merge`).
    merge: str = "auto"
    # Partial O of each split: fp32, or rounded to q's dtype ("input": half the partial bytes,
    # one extra rounding per partial; the derived test tolerance adds it).
    partial_dtype: str = "fp32"
    kernel: str = "triton"  # the variant (variants.VARIANTS)

    def __post_init__(self) -> None:
        for name in ("block_h", "block_n"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16 (tl.dot), got {v}")
        if self.merge not in MERGES:
            raise ValueError(f"merge must be one of {MERGES}, got {self.merge!r}")
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        if self.partial_dtype not in ("fp32", "input"):
            raise ValueError(f"partial_dtype must be 'fp32' or 'input', got {self.partial_dtype!r}")

    @property
    def tile(self) -> str:
        """Heads x tokens per tile, as the launch record names it."""
        return f"{self.block_h}x{self.block_n}"


@dataclass(frozen=True, slots=True)
class MergePolicy:
    """When "auto" takes the PDL merge: B <= max_b and the split grid fills at most max_fill
    of the program slots (the measured rule lives in the defaults file's `[merge]`)."""

    pdl_max_fill: float
    pdl_max_b: int


def resolve_merge(cfg: SplitConfig, b: int, h: int, num_splits: int, num_sms: int,
                  policy: MergePolicy, pdl_ok: bool) -> str:  # fmt: skip
    """The merge a launch uses: "single" for one split (the split kernel writes the output);
    "auto" -> "pdl" when B <= policy.pdl_max_b and the split grid (B x head blocks x splits)
    fills at most policy.pdl_max_fill of the program slots (ctas_per_sm x SMs), else
    "kernel"; "pdl" -> "kernel" where the launch cannot (`pdl_ok` False: the interpreter, a
    GPU before Hopper, a split kernel that does not trigger dependents)."""
    if num_splits == 1:
        return "single"
    merge = cfg.merge
    if merge == "auto":
        fill = b * triton.cdiv(h, cfg.block_h) * num_splits / (cfg.ctas_per_sm * num_sms)
        merge = "pdl" if b <= policy.pdl_max_b and fill <= policy.pdl_max_fill else "kernel"
    return merge if merge != "pdl" or pdl_ok else "kernel"


def choose_num_splits(b: int, h: int, topk: int, cfg: SplitConfig, num_sms: int) -> int:
    """Split count so that B x head-blocks x splits is about waves x ctas_per_sm x SMs.

    Never more splits than tiles (a split owns whole tiles), and 1 when the grid is already
    full without splitting (then the merge kernel is skipped).
    """
    n_hblk = triton.cdiv(h, cfg.block_h)
    n_tiles = max(triton.cdiv(topk, cfg.block_n), 1)
    base = b * n_hblk
    want = max(int(cfg.waves * cfg.ctas_per_sm * num_sms) // max(base, 1), 1)
    max_splits = max(n_tiles // cfg.min_tiles_per_split, 1)
    splits = min(want, max_splits, MAX_SPLITS)
    # Equalise: every split gets the same whole number of tiles, no empty trailing split.
    tiles_per_split = triton.cdiv(n_tiles, splits)
    return triton.cdiv(n_tiles, tiles_per_split)
