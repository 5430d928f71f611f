"""Roofline of one decode step: model x GPU x tensor parallelism x batch -> a tokens/s ceiling.

Per step (batch B, q tokens per request: 1, or draft+1 when MTP verifies):
- weight bytes: every dense weight once, plus for each MoE layer the expected number of distinct
  experts the B*q tokens touch, E (1 - (1 - k/E)^(B q)) (k of E routed uniformly per token);
- KV bytes: each request reads its attended KV rows once per layer (full context, or for sparse
  attention the top-k + window), plus the sparse indexer's keys;
- FLOPs: 2 x active parameters x tokens, plus attention (2 H n_attended (d_qk + d_v) per token);
- TP all-reduce: two per layer of B q x hidden bf16 activations, ring: 2 (N-1)/N bytes over the
  per-direction link bandwidth.
step = max(memory, compute) + communication. With MTP, tokens per step = B x tau and each step
also runs `draft` passes of the MTP layer. The bound ignores launch latency and all-reduce
latency unless `allreduce_latency_us` is given: it is a ceiling, not a prediction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from servelab.errors import UserError

# Bytes per parameter. fp8: + one fp32 scale per 128x128 block; fp4: NVFP4, e2m1 + an e4m3
# scale per 16 values.
DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0 + 4.0 / (128 * 128), "fp4": 0.5 + 1.0 / 16}
ACT_BYTES = 2.0  # bf16 activations in all-reduces


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Parameter and attention shape of a decoder, derived from an HF config."""

    name: str
    hidden: int
    n_layers: int
    attn_params: int  # per layer
    dense_ffn_params: int  # per dense layer
    n_dense_layers: int
    n_moe_layers: int
    n_experts: int
    top_k: int
    expert_params: int
    shared_params: int  # per MoE layer: shared experts + router
    lm_head_params: int
    attn_heads: int
    d_qk: int
    d_v: int
    kv_heads: int  # KV rows per token per layer read by all heads (1 for MLA)
    kv_bytes_per_token: dict[str, float]  # per layer, by KV dtype
    sparse_topk: int | None = None
    window: int | None = None
    index_bytes_per_token: float = 0.0  # per layer (fp8 keys + scale)
    index_ratio: int = 1  # indexer sees every index_ratio-th token (compressed KV)
    index_flops_per_key: float = 0.0
    mtp_layers: int = 0
    default_weight_dtype: str = "bf16"
    default_expert_dtype: str | None = None

    @property
    def total_params(self) -> int:
        ffn = self.n_dense_layers * self.dense_ffn_params + self.n_moe_layers * (
            self.n_experts * self.expert_params + self.shared_params
        )
        return self.n_layers * self.attn_params + ffn + self.lm_head_params

    @property
    def active_params(self) -> int:
        """Parameters one token uses (k experts per MoE layer)."""
        ffn = self.n_dense_layers * self.dense_ffn_params + self.n_moe_layers * (
            self.top_k * self.expert_params + self.shared_params
        )
        return self.n_layers * self.attn_params + ffn + self.lm_head_params

    def attended(self, context: int) -> int:
        """KV rows one request reads per layer at this context length."""
        if self.sparse_topk is None:
            return context
        return min(context, self.sparse_topk + (self.window or 0))


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Bandwidths and dense tensor rates of one GPU."""

    name: str
    hbm_bytes_s: float
    link_bytes_s: float
    flops: dict[str, float]
    memory_bytes: float | None = None
    sms: int | None = None

    def peak(self, dtype: str) -> tuple[float, str]:
        """Dense rate for GEMMs with `dtype` weights; the next wider type where unsupported."""
        for d in (dtype, "fp8", "bf16"):
            if d in self.flops and DTYPE_BYTES.get(d, 2.0) >= DTYPE_BYTES.get(dtype, 2.0) - 1e-9:
                return self.flops[d], d
        return self.flops["bf16"], "bf16"


def expected_distinct_experts(n_experts: int, top_k: int, tokens: int) -> float:
    """E[# distinct experts] when `tokens` tokens each pick `top_k` of `n_experts` uniformly."""
    if n_experts <= 0 or tokens <= 0:
        return 0.0
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** tokens)


def _get(cfg: dict, *keys: str, default=None):
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def model_from_config(
    cfg: dict,
    name: str = "config.json",
    kv_bytes_per_token: dict[str, float] | None = None,
    default_weight_dtype: str = "bf16",
    default_expert_dtype: str | None = None,
) -> ModelSpec:
    """Build a `ModelSpec` from a Hugging Face `config.json` dict (Llama/Qwen/Mixtral/DeepSeek)."""
    try:
        h = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(
            f"{name}: config needs hidden_size, num_hidden_layers, num_attention_heads and "
            f"vocab_size ({exc!r} missing or not a number)"
        ) from None
    if min(h, layers, heads, vocab) < 1:
        raise UserError(
            f"{name}: hidden_size, num_hidden_layers, num_attention_heads and vocab_size must be "
            f">= 1, got {h}, {layers}, {heads}, {vocab}"
        )
    try:
        return _model_from_config(cfg, name, h, layers, heads, vocab, kv_bytes_per_token,
                                  default_weight_dtype, default_expert_dtype)
    except KeyError as exc:
        raise UserError(f"{name}: config has no {exc.args[0]!r}, which this model type needs") from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"{name}: a config value is not a number ({exc})") from None


def _model_from_config(
    cfg: dict, name: str, h: int, layers: int, heads: int, vocab: int,
    kv_bytes_per_token: dict[str, float] | None, default_weight_dtype: str,
    default_expert_dtype: str | None,
) -> ModelSpec:
    mtype = str(cfg.get("model_type", ""))
    q_lora = _get(cfg, "q_lora_rank")
    sparse_topk = _get(cfg, "index_topk")
    window = None
    index_bpt = 0.0
    index_ratio = 1
    index_flops = 0.0
    idx_heads = int(_get(cfg, "index_n_heads", default=0))
    idx_dim = int(_get(cfg, "index_head_dim", default=0))
    indexer_params = 0
    if sparse_topk:
        index_bpt = idx_dim + 4.0  # fp8 key + fp32 scale per token per layer
        index_flops = 2.0 * idx_heads * idx_dim
        indexer_params = (q_lora or h) * idx_heads * idx_dim + h * idx_dim + h * idx_heads
    if mtype == "deepseek_v4":
        hd = int(cfg["head_dim"])
        rope = int(_get(cfg, "qk_rope_head_dim", default=64))
        o_lora = int(_get(cfg, "o_lora_rank", default=h))
        groups = int(_get(cfg, "o_groups", default=1))
        q = h * q_lora + q_lora * heads * hd if q_lora else h * heads * hd
        attn = q + h * hd + heads * hd * o_lora + groups * o_lora * h + 2 * h * hd + indexer_params
        d_qk = d_v = hd
        kv_heads = 1
        kv_default = {"bf16": hd * 2.0, "fp8": (hd - rope) + 4.0 * math.ceil((hd - rope) / 128) + rope * 2.0}
        window = _get(cfg, "sliding_window")
        index_ratio = 4  # indexer scores the 4x-compressed KV entries
    elif _get(cfg, "kv_lora_rank") is not None and _get(cfg, "qk_nope_head_dim") is not None:
        kv_lora = int(cfg["kv_lora_rank"])
        nope, rope = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"])
        v = int(cfg["v_head_dim"])
        q = h * q_lora + q_lora * heads * (nope + rope) if q_lora else h * heads * (nope + rope)
        attn = q + h * (kv_lora + rope) + kv_lora * heads * (nope + v) + heads * v * h + indexer_params
        d_qk, d_v = kv_lora + rope, kv_lora  # absorbed MLA decode: MQA over the latent
        kv_heads = 1
        kv_default = {"bf16": (kv_lora + rope) * 2.0, "fp8": kv_lora + 4.0 * (kv_lora // 128) + rope * 2.0}
    else:
        hd = int(_get(cfg, "head_dim", default=h // heads))
        kv = int(_get(cfg, "num_key_value_heads", default=heads))
        attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
        d_qk = d_v = hd
        kv_heads = kv
        kv_default = {"bf16": 2.0 * kv * hd * 2.0, "fp8": 2.0 * kv * hd * 1.0}
    n_exp = int(_get(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0))
    top_k = int(_get(cfg, "num_experts_per_tok", "num_experts_per_token", default=0))
    inter = _get(cfg, "intermediate_size")
    if n_exp and top_k:
        moe_inter = _get(cfg, "moe_intermediate_size", default=inter)
        if moe_inter is None:
            raise KeyError("moe_intermediate_size")
        moe_inter = int(moe_inter)
        expert = 3 * h * moe_inter
        shared = int(_get(cfg, "n_shared_experts", default=0)) * expert
        shared += 3 * h * int(_get(cfg, "shared_expert_intermediate_size", default=0)) + h * n_exp
        n_dense = int(_get(cfg, "first_k_dense_replace", default=0))
        n_dense += len(cfg.get("mlp_only_layers") or [])
        n_moe = layers - n_dense
    else:
        n_exp = top_k = expert = shared = n_moe = 0
        n_dense = layers
    if n_dense and inter is None:
        raise UserError(f"{name}: config has dense layers but no intermediate_size")
    dense_ffn = 3 * h * int(inter) if n_dense else 0
    return ModelSpec(
        name=name,
        hidden=h,
        n_layers=layers,
        attn_params=int(attn),
        dense_ffn_params=dense_ffn,
        n_dense_layers=n_dense,
        n_moe_layers=n_moe,
        n_experts=n_exp,
        top_k=top_k,
        expert_params=expert,
        shared_params=shared,
        lm_head_params=vocab * h,  # read every step (tied or not)
        attn_heads=heads,
        d_qk=d_qk,
        d_v=d_v,
        kv_heads=kv_heads,
        kv_bytes_per_token=dict(kv_default, **(kv_bytes_per_token or {})),
        sparse_topk=int(sparse_topk) if sparse_topk else None,
        window=int(window) if window else None,
        index_bytes_per_token=index_bpt,
        index_ratio=index_ratio,
        index_flops_per_key=index_flops,
        mtp_layers=int(_get(cfg, "num_nextn_predict_layers", default=0)),
        default_weight_dtype=default_weight_dtype,
        default_expert_dtype=default_expert_dtype,
    )


@dataclass(frozen=True, slots=True)
class StepCost:
    """Bytes, FLOPs and all-reduce bytes of one forward over `tokens` tokens."""

    weight_bytes: float
    kv_bytes: float
    flops: float
    allreduce_bytes: float  # per GPU, ring
    distinct_experts: float
    n_allreduce: float = 0.0


@dataclass(frozen=True, slots=True)
class Bound:
    """The ceiling at one batch size."""

    batch: int
    tokens_per_step: float
    step_us: float
    memory_us: float
    compute_us: float
    comm_us: float
    bound: str  # the largest term: "memory" | "compute" | "communication"
    tok_s: float
    tok_s_per_request: float
    weight_bytes: float
    kv_bytes: float
    flops: float
    distinct_experts: float
    draft_us: float = 0.0
    notes: list[str] = field(default_factory=list)


def _forward_cost(
    m: ModelSpec, batch: int, q: int, context: int, wdt: str, edt: str, kdt: str, tp: int,
    layers: int | None = None, lm_head: bool = True,
) -> StepCost:
    """Cost of one pass of `layers` layers (all by default) for `batch` requests x `q` tokens."""
    tokens = batch * q
    frac = 1.0 if layers is None else layers / m.n_layers
    wb, eb = DTYPE_BYTES[wdt], DTYPE_BYTES[edt]
    distinct = expected_distinct_experts(m.n_experts, m.top_k, tokens)
    n_moe = m.n_moe_layers * frac if layers is None else (layers if m.n_moe_layers else 0)
    n_dense = m.n_dense_layers * frac if layers is None else (0 if m.n_moe_layers else layers)
    n_layers = m.n_layers * frac
    dense = n_layers * m.attn_params + n_dense * m.dense_ffn_params + n_moe * m.shared_params
    weight_bytes = dense * wb + n_moe * distinct * m.expert_params * eb
    weight_bytes += m.lm_head_params * DTYPE_BYTES["bf16"] if lm_head else 0.0
    active = dense + n_moe * m.top_k * m.expert_params + (m.lm_head_params if lm_head else 0)
    attended = m.attended(context)
    index_keys = context / m.index_ratio if m.index_bytes_per_token else 0.0
    kv_bpt = m.kv_bytes_per_token.get(kdt)
    if kv_bpt is None:
        raise UserError(f"{m.name}: no KV size for --kv-dtype {kdt}; known: {list(m.kv_bytes_per_token)}")
    kv_bytes = batch * n_layers * (attended * kv_bpt + index_keys * m.index_bytes_per_token)
    attn_flops = 2.0 * m.attn_heads * attended * (m.d_qk + m.d_v) + index_keys * m.index_flops_per_key
    flops = 2.0 * active * tokens + tokens * n_layers * attn_flops
    allreduce = 0.0
    if tp > 1:
        allreduce = 2 * n_layers * 2.0 * (tp - 1) / tp * tokens * m.hidden * ACT_BYTES
    return StepCost(weight_bytes, kv_bytes, flops, allreduce, distinct, 2 * n_layers)


def _times(
    cost: StepCost, m: ModelSpec, gpu: GpuSpec, tp: int, peak: float, ar_latency_s: float = 0.0
) -> tuple[float, float, float]:
    kv_replication = tp / min(tp, max(m.kv_heads, 1))  # MLA: every TP rank reads all latent rows
    mem_s = (cost.weight_bytes / tp + cost.kv_bytes * kv_replication / tp) / gpu.hbm_bytes_s
    comp_s = cost.flops / tp / peak
    comm_s = cost.allreduce_bytes / gpu.link_bytes_s + cost.n_allreduce * ar_latency_s if tp > 1 else 0.0
    return mem_s, comp_s, comm_s


def resolve_dtypes(
    m: ModelSpec, weight_dtype: str | None, expert_dtype: str | None
) -> tuple[str, str]:
    """(weight dtype, expert dtype) as the bound uses them.

    Without `--weight-dtype` the preset's defaults apply (V4-Flash: fp8 weights, fp4 experts);
    an explicit `--weight-dtype` sets the experts too unless `--expert-dtype` is given.
    """
    wdt = weight_dtype or m.default_weight_dtype
    edt = expert_dtype or (m.default_expert_dtype if weight_dtype is None else None) or wdt
    for d in (wdt, edt):
        if d not in DTYPE_BYTES:
            raise UserError(f"unknown dtype {d!r}; known: {', '.join(DTYPE_BYTES)}")
    return wdt, edt


MAX_TP, MAX_BATCH, MAX_CONTEXT, MAX_DRAFT = 65_536, 1 << 24, 1 << 30, 64


def ceiling(
    m: ModelSpec,
    gpu: GpuSpec,
    batches: list[int],
    context: int = 4096,
    tp: int = 1,
    weight_dtype: str | None = None,
    expert_dtype: str | None = None,
    kv_dtype: str = "bf16",
    mtp_accept: float | None = None,
    mtp_draft: int = 1,
    allreduce_latency_us: float = 0.0,
) -> list[Bound]:
    """Decode tokens/s ceiling per batch size (see the module docstring for the model).

    `allreduce_latency_us` (default 0: a pure bandwidth bound) adds a fixed cost per all-reduce,
    e.g. NCCL's small-message latency measured with nccl-tests on the target machine.
    """
    # upper bounds are what any deployment could have, with room to spare: past them a number is
    # a typo, and past 2^63 it would fail inside numpy instead of here
    if not 0 <= allreduce_latency_us < 1e9:
        raise UserError(f"--allreduce-latency-us must be >= 0 and finite, got {allreduce_latency_us}")
    lat = allreduce_latency_us * 1e-6
    wdt, edt = resolve_dtypes(m, weight_dtype, expert_dtype)
    if not 1 <= tp <= MAX_TP:
        raise UserError(f"--tp must be between 1 and {MAX_TP:,}, got {tp}")
    if not batches:
        raise UserError("--batch needs at least one batch size, e.g. --batch 1,8,16")
    if not all(0 <= b <= MAX_BATCH for b in batches):
        raise UserError(f"--batch sizes must be between 0 and {MAX_BATCH:,}, got "
                        f"{max(batches, key=lambda b: abs(b))}")
    if not 0 <= context <= MAX_CONTEXT:
        raise UserError(f"--context must be between 0 and {MAX_CONTEXT:,} tokens, got {context}")
    if mtp_accept is not None and not 1 <= mtp_draft <= MAX_DRAFT:
        raise UserError(f"--mtp-draft must be >= 1 draft token per step (at most {MAX_DRAFT}), "
                        f"got {mtp_draft}")
    if mtp_accept is not None and not 1.0 <= mtp_accept <= mtp_draft + 1:
        raise UserError(
            f"--mtp-accept {mtp_accept} must lie in [1, draft + 1 = {mtp_draft + 1}] "
            "(tokens per verify step, bonus token included)"
        )
    peak, peak_dtype = gpu.peak(min(wdt, edt, key=lambda d: DTYPE_BYTES[d]))
    notes = []
    if peak_dtype != min(wdt, edt, key=lambda d: DTYPE_BYTES[d]):
        notes.append(f"{gpu.name} has no {wdt}/{edt} tensor rate; compute at its {peak_dtype} rate")
    if mtp_accept is not None and m.mtp_layers == 0:
        notes.append(f"{m.name} has no MTP layer in its config; each draft costs one extra layer")
    out = []
    for b in batches:
        if b < 1:
            raise UserError(f"--batch values must be >= 1, got {b}")
        q = mtp_draft + 1 if mtp_accept is not None else 1
        main = _forward_cost(m, b, q, context, wdt, edt, kv_dtype, tp)
        mem, comp, comm = _times(main, m, gpu, tp, peak, lat)
        draft_s = 0.0
        if mtp_accept is not None:
            # one MTP (NextN) layer + the shared LM head, per draft token, at batch b
            d = _forward_cost(m, b, 1, context, wdt, edt, kv_dtype, tp, layers=1)
            dm, dc, dcomm = _times(d, m, gpu, tp, peak, lat)
            draft_s = mtp_draft * (max(dm, dc) + dcomm)
        step = max(mem, comp) + comm + draft_s
        per_req = (mtp_accept or 1.0) / step
        out.append(
            Bound(
                batch=b,
                tokens_per_step=b * (mtp_accept or 1.0),
                step_us=step * 1e6,
                memory_us=mem * 1e6,
                compute_us=comp * 1e6,
                comm_us=comm * 1e6,
                bound=max((mem, "memory"), (comp, "compute"), (comm, "communication"))[1],
                tok_s=b * per_req,
                tok_s_per_request=per_req,
                weight_bytes=main.weight_bytes,
                kv_bytes=main.kv_bytes,
                flops=main.flops,
                distinct_experts=main.distinct_experts,
                draft_us=draft_s * 1e6,
                notes=list(notes),
            )
        )
    return out
