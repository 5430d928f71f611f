"""Model configurations as data: `tiny` (CPU, trained weights) and `flash` (GPU, V4-Flash shapes).

The model is a miniature DeepSeek-V4-style decoder (see model.py). Attention is absorbed MLA:
every token caches ONE latent row of `kv_lora_rank + qk_rope_head_dim` values shared by all
heads; a query attends to a sliding window of recent rows plus the top-k older rows picked by a
cheap indexer. The value is the first `value_dim` columns of the same row.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from servelab.errors import UserError


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Every shape of the model. Invariants are checked in __post_init__."""

    name: str
    vocab_size: int = 264  # 256 bytes + specials (tokenizer.py), padded to a multiple of 8
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    q_lora_rank: int = 0  # 0: queries projected directly from the hidden state
    kv_lora_rank: int = 64  # latent (compressed) KV width
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 16
    v_head_dim: int = 32
    value_dim: int = 64  # leading columns of the cached row used as value (V3.2: kv_lora_rank)
    index_heads: int = 2  # indexer (lightning-indexer style) heads
    index_dim: int = 16
    window: int = 64  # always-attended recent positions
    topk: int = 64  # extra positions picked by the indexer beyond the window
    n_routed_experts: int = 4
    n_shared_experts: int = 1
    moe_top_k: int = 2
    moe_inter_dim: int = 128
    rope_theta: float = 10000.0
    max_position: int = 4096
    mtp_loss_weight: float = 0.3  # DeepSeek-V3: lambda 0.3 early in training, 0.1 later
    dtype: str = "float32"  # compute dtype when served (checkpoints may be stored in bf16)

    def __post_init__(self) -> None:
        if self.value_dim > self.kv_dim:
            raise ValueError(f"value_dim {self.value_dim} > cached row width {self.kv_dim}")
        if self.moe_top_k > self.n_routed_experts:
            raise ValueError("moe_top_k must be <= n_routed_experts")
        if self.qk_rope_head_dim % 2:
            raise ValueError("qk_rope_head_dim must be even")

    @property
    def kv_dim(self) -> int:
        """Width of one cached latent row (D_qk of the sparse MLA kernel)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def attend_k(self) -> int:
        """Positions one query attends once the context is long (window + top-k)."""
        return self.window + self.topk

    def to_dict(self) -> dict:
        """Plain dict, for checkpoints and /get_server_info."""
        return asdict(self)


# tiny: ~3M parameters, trained on the CPU-or-GPU in minutes; stored as bf16 (<= 10 MB).
TINY = ModelConfig(name="tiny")

# flash: the per-layer attention shapes of DeepSeek-V4-Flash (docs/FIELD.md: 64 query heads,
# 512-wide latent row = 448 + 64 rope, value = the whole row, window 128 + top-k 512) with few
# layers and random weights, for speed work on the H200. Hidden 4096, q_lora 1024 and expert
# width 2048 follow the GEMM shapes of the story.
FLASH = ModelConfig(
    name="flash",
    d_model=4096,
    n_layers=4,
    n_heads=64,
    q_lora_rank=1024,
    kv_lora_rank=448,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    value_dim=512,
    index_heads=4,
    index_dim=64,
    window=128,
    topk=512,
    n_routed_experts=8,
    n_shared_experts=1,
    moe_top_k=2,
    moe_inter_dim=2048,
    dtype="bfloat16",
)

# micro: for fast tests only (a few thousand parameters worth of shapes, tiny window/top-k so the
# sparse path is exercised at short lengths).
MICRO = ModelConfig(
    name="micro",
    d_model=32,
    n_layers=2,
    n_heads=2,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=8,
    value_dim=16,
    index_heads=2,
    index_dim=8,
    window=4,
    topk=4,
    n_routed_experts=3,
    moe_top_k=2,
    moe_inter_dim=32,
)

CONFIGS: dict[str, ModelConfig] = {c.name: c for c in (TINY, FLASH, MICRO)}


def get_config(name: str, **overrides: object) -> ModelConfig:
    """The named config, with optional field overrides (for tests and experiments)."""
    if name not in CONFIGS:
        raise UserError(f"unknown model config {name!r}; choose one of {sorted(CONFIGS)}")
    return replace(CONFIGS[name], **overrides) if overrides else CONFIGS[name]
