"""A miniature DeepSeek-V4-style decoder: absorbed MLA with a latent KV cache, window + top-k
sparse attention picked by an indexer, MoE feed-forward, and an MTP (NextN) head.

Two paths compute the same function:
- `forward_train(tokens [B, S])`: dense masked attention over whole sequences (training, tests).
- `forward_flat(tokens [N], ...)`: the serving path. N query tokens from any mix of requests
  (prefill chunks, decode tokens, speculative verify tokens), each with its own cache slot and
  position. Each token writes its cached row first, then attends through the sparse MLA function
  `attn_fn(q [N, H, D_qk], kv [T, D_qk], indices [N, K], sm_scale, d_v)`.
The KV cache is one flat table of rows per layer: slot s, position p lives at row s * ctx + p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from servelab.mini.model.attention import AttentionFn, torch_sparse_mla
from servelab.mini.model.config import ModelConfig


@dataclass(slots=True)
class FlatBatch:
    """Per-forward metadata shared by all layers (built once from slots and positions)."""

    positions: torch.Tensor  # [N] int64
    rows: torch.Tensor  # [N] int64, where each token's cached row is written
    cand: torch.Tensor  # [N, L] int64, candidate rows (the token's slot, positions 0..L-1)
    valid: torch.Tensor  # [N, L] bool, candidate position <= own position
    in_window: torch.Tensor  # [N, L] bool
    dense_indices: torch.Tensor | None  # [N, L] int32 when L <= window + top-k (no indexer)
    recency: torch.Tensor  # [L] float32 tie-break added to indexer scores


# ReLU indexer scores are often exactly 0: ties would be broken differently by topk over
# different candidate counts (prefill vs decode). A tiny recency term makes the choice
# deterministic: among equal scores the most recent positions win.
RECENCY = 1e-5


def make_batch(cfg: ModelConfig, slots: torch.Tensor, positions: torch.Tensor, ctx: int,
               cand_len: int) -> FlatBatch:
    """Metadata for N tokens: slot [N], position [N]; candidates are positions < cand_len."""
    base = slots * ctx  # [N]
    ar = torch.arange(cand_len, device=slots.device)
    cand = base[:, None] + ar[None, :]  # [N, L]
    rel = positions[:, None] - ar[None, :]
    valid = rel >= 0
    in_window = valid & (rel < cfg.window)
    dense = None
    if cand_len <= cfg.attend_k:
        dense = torch.where(valid, cand, -1).to(torch.int32)
    recency = RECENCY * ar.float()
    return FlatBatch(positions, base + positions, cand, valid, in_window, dense, recency)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate halves of the last dim; cos/sin broadcast to x[..., :half]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class MLA(nn.Module):
    """Absorbed multi-head latent attention with an indexer for window + top-k selection."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, nope, rp = cfg.n_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        if cfg.q_lora_rank:
            self.wq_a = nn.Linear(cfg.d_model, cfg.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(cfg.q_lora_rank)
            self.wq_b = nn.Linear(cfg.q_lora_rank, h * (nope + rp), bias=False)
        else:
            self.wq = nn.Linear(cfg.d_model, h * (nope + rp), bias=False)
        self.wkv_a = nn.Linear(cfg.d_model, cfg.kv_dim, bias=False)
        self.kv_norm = RMSNorm(cfg.kv_lora_rank)
        # Absorbed up-projections: q_nope -> latent (keys), latent value row -> v_head (values).
        self.w_uk = nn.Parameter(torch.randn(h, nope, cfg.kv_lora_rank) / math.sqrt(nope))
        self.w_uv = nn.Parameter(torch.randn(h, cfg.value_dim, cfg.v_head_dim)
                                 / math.sqrt(cfg.value_dim))
        self.wo = nn.Linear(h * cfg.v_head_dim, cfg.d_model, bias=False)
        # Indexer: I(t, s) = sum_j w_tj relu(q_tj . k_s), on detached inputs (DSA style).
        self.wi_q = nn.Linear(cfg.d_model, cfg.index_heads * cfg.index_dim, bias=False)
        self.wi_w = nn.Linear(cfg.d_model, cfg.index_heads, bias=False)
        self.wi_k = nn.Linear(cfg.d_model, cfg.index_dim, bias=False)
        self.sm_scale = 1.0 / math.sqrt(nope + rp)

    def _q(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Absorbed queries [..., H, D_qk] for hidden states x [..., d]."""
        c = self.cfg
        q = self.wq_b(self.q_norm(self.wq_a(x))) if c.q_lora_rank else self.wq(x)
        q = q.unflatten(-1, (c.n_heads, c.qk_nope_head_dim + c.qk_rope_head_dim))
        q_nope, q_rope = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        q_lat = torch.einsum("...hp,hpc->...hc", q_nope, self.w_uk)
        return torch.cat((q_lat, rope(q_rope, cos[..., None, :], sin[..., None, :])), dim=-1)

    def _row(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The cached latent row [..., D_qk]: normalized latent + rotated shared rope key."""
        return self._row_from(self.wkv_a(x), cos, sin)

    def _row_from(self, kva: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The cached row from the latent projection kva [..., kv_lora_rank + rope dim]."""
        c_kv, k_rope = kva.split([self.cfg.kv_lora_rank, self.cfg.qk_rope_head_dim], -1)
        return torch.cat((self.kv_norm(c_kv), rope(k_rope, cos, sin)), dim=-1)

    def _index_q(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        qi = self.wi_q(x).unflatten(-1, (self.cfg.index_heads, self.cfg.index_dim))
        return qi, self.wi_w(x)

    def _out(self, o_lat: torch.Tensor) -> torch.Tensor:
        """Latent attention output [..., H, value_dim] -> hidden [..., d]."""
        return self.wo(torch.einsum("...hc,hcv->...hv", o_lat, self.w_uv).flatten(-2))

    def prepare_inference(self) -> None:
        """Concatenate the projections that read the layer input (queries, latent KV, indexer)
        into one matrix: one GEMM per layer when serving instead of five (CPU decode is bound
        by per-op overhead). Call again after changing weights."""
        c = self.cfg
        first = self.wq_a.weight if c.q_lora_rank else self.wq.weight
        ws = [first, self.wkv_a.weight, self.wi_k.weight, self.wi_q.weight, self.wi_w.weight]
        self.fused_w = torch.cat(ws).contiguous()
        self.fused_split = [w.shape[0] for w in ws]

    def forward_flat(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fb: FlatBatch,
                     kv: torch.Tensor, ik: torch.Tensor, attn_fn: AttentionFn) -> torch.Tensor:
        """Serving path: x [N, d]; writes rows into kv [T, D_qk] / ik [T, dI], then attends.
        Needs prepare_inference(); no autograd."""
        c = self.cfg
        n = x.shape[0]
        qa, kva, k_idx, qi, wi = F.linear(x, self.fused_w).split(self.fused_split, -1)
        row = self._row_from(kva, cos, sin)  # [N, D_qk]
        kv.index_copy_(0, fb.rows, row.to(kv.dtype))
        ik.index_copy_(0, fb.rows, k_idx.to(ik.dtype))
        indices = fb.dense_indices
        if indices is None:
            keys = ik[fb.cand]  # [N, L, dI]
            score = torch.bmm(keys, qi.view(n, c.index_heads, c.index_dim).transpose(1, 2))
            score = torch.bmm(score.relu(), wi[:, :, None]).squeeze(-1)  # [N, L]
            score = score.float() + fb.recency
            score = score.masked_fill(fb.in_window, float("inf"))
            score = score.masked_fill(~fb.valid, float("-inf"))
            top_v, top_i = score.topk(c.attend_k, dim=-1)  # [N, K]
            indices = torch.where(top_v > float("-inf"), fb.cand.gather(1, top_i), -1)
            indices = indices.to(torch.int32)
        q = self.wq_b(self.q_norm(qa)) if c.q_lora_rank else qa
        q = q.view(n, c.n_heads, c.qk_nope_head_dim + c.qk_rope_head_dim)
        q_nope, q_rope = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        q_lat = torch.bmm(q_nope.transpose(0, 1), self.w_uk).transpose(0, 1)  # [N, H, C]
        q = torch.cat((q_lat, rope(q_rope, cos[:, None, :], sin[:, None, :])), dim=-1)
        o, _ = attn_fn(q.to(kv.dtype), kv, indices, self.sm_scale, c.value_dim)  # [N, H, dv]
        o = torch.bmm(o.to(x.dtype).transpose(0, 1), self.w_uv).transpose(0, 1)  # [N, H, v]
        return self.wo(o.reshape(n, c.n_heads * c.v_head_dim))

    def forward_train(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Dense masked path: x [B, S, d] -> (out [B, S, d], indexer KL loss)."""
        c = self.cfg
        s = x.shape[1]
        rows = self._row(x, cos, sin)  # [B, S, D_qk]
        q = self._q(x, cos, sin)  # [B, S, H, D_qk]
        pos = torch.arange(s, device=x.device)
        rel = pos[:, None] - pos[None, :]
        causal = rel >= 0
        xd = x.detach()
        qi, wi = self._index_q(xd)
        ki = self.wi_k(xd)  # [B, S, dI]
        iscore = torch.einsum("bthd,bsd->bhts", qi, ki).relu()
        iscore = torch.einsum("bhts,bth->bts", iscore, wi).float()  # [B, S, S]
        if s > c.attend_k:
            sel = (iscore.detach() + RECENCY * pos.float()).masked_fill((rel < c.window) & causal, float("inf"))
            sel = sel.masked_fill(~causal, float("-inf"))
            top_v, top_i = sel.topk(c.attend_k, dim=-1)
            mask = torch.zeros_like(sel, dtype=torch.bool).scatter_(-1, top_i, top_v > float("-inf"))
        else:
            mask = causal.expand(x.shape[0], s, s)
        scores = torch.einsum("bthd,bsd->bhts", q, rows).float() * self.sm_scale
        probs = scores.masked_fill(~mask[:, None], float("-inf")).softmax(-1)  # [B, H, S, S]
        o = torch.einsum("bhts,bsc->bthc", probs.to(rows.dtype), rows[..., : c.value_dim])
        # Indexer target: the heads' mean attention over all causal positions (detached).
        with torch.no_grad():
            target = scores.masked_fill(~causal, float("-inf")).softmax(-1).mean(1)
        logq = iscore.masked_fill(~causal, float("-inf")).log_softmax(-1)
        kl = (target * (target.clamp_min(1e-9).log() - logq.masked_fill(~causal, 0))).sum(-1)
        return self._out(o), kl.mean()


class MoE(nn.Module):
    """Shared expert + routed experts with softmax top-k routing (renormalized gates).

    Routed experts are computed densely for every token and combined with zero gates for the
    unselected ones: identical math, no data-dependent shapes (CUDA-graph friendly), and cheap at
    miniature sizes.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        e, d, f = cfg.n_routed_experts, cfg.d_model, cfg.moe_inter_dim
        self.top_k = cfg.moe_top_k
        self.gate = nn.Linear(d, e, bias=False)
        self.w13 = nn.Parameter(torch.randn(e, d, 2 * f) / math.sqrt(d))
        self.w2 = nn.Parameter(torch.randn(e, f, d) / math.sqrt(f))
        fs = f * cfg.n_shared_experts
        self.shared13 = nn.Linear(d, 2 * fs, bias=False)
        self.shared2 = nn.Linear(fs, d, bias=False)

    def forward(self, x: torch.Tensor, aux: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [..., d] -> (out [..., d], load-balance loss if aux else None)."""
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # [N, d]
        probs = self.gate(x2).float().softmax(-1)  # [N, E]
        top_p, top_i = probs.topk(self.top_k, dim=-1)
        gates = torch.zeros_like(probs).scatter_(-1, top_i, top_p / top_p.sum(-1, keepdim=True))
        a, b = torch.matmul(x2, self.w13).chunk(2, dim=-1)  # [E, N, f]
        routed = torch.matmul(F.silu(a) * b, self.w2)  # [E, N, d]
        out = torch.bmm(gates.to(x.dtype)[:, None, :], routed.transpose(0, 1))[:, 0]  # [N, d]
        sa, sb = self.shared13(x2).chunk(2, dim=-1)
        out = out + self.shared2(F.silu(sa) * sb)
        if not aux:
            return out.reshape(shape), None
        # Switch-style balance loss: E * sum_e (fraction routed to e) * (mean prob of e).
        frac = (gates > 0).float().mean(0)
        balance = probs.shape[-1] * (frac * probs.mean(0)).sum() / self.top_k
        return out.reshape(shape), balance


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = MLA(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model)
        self.ffn = MoE(cfg)


class MiniModel(nn.Module):
    """Decoder stack + MTP module (index n_layers of `cache` lists) sharing embedding and head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        # MTP (DeepSeek-V3): h' = W [norm(h_i); norm(emb(t_{i+1}))] -> block -> norm -> head.
        self.mtp_hnorm = RMSNorm(cfg.d_model)
        self.mtp_enorm = RMSNorm(cfg.d_model)
        self.mtp_proj = nn.Linear(2 * cfg.d_model, cfg.d_model, bias=False)
        self.mtp_block = Block(cfg)
        self.mtp_norm = RMSNorm(cfg.d_model)
        half = cfg.qk_rope_head_dim // 2
        inv = 1.0 / cfg.rope_theta ** (torch.arange(half, dtype=torch.float32) / half)
        ang = torch.outer(torch.arange(cfg.max_position, dtype=torch.float32), inv)
        self.register_buffer("rope_cos", ang.cos(), persistent=False)
        self.register_buffer("rope_sin", ang.sin(), persistent=False)

    # ---- training / reference path -------------------------------------------------------
    def _block_train(self, blk: Block, x: torch.Tensor, cos, sin):
        a, kl = blk.attn.forward_train(blk.attn_norm(x), cos, sin)
        x = x + a
        f, bal = blk.ffn(blk.ffn_norm(x))
        return x + f, kl, bal

    def forward_train(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """tokens [B, S] -> logits [B, S, V], mtp_logits [B, S-1, V] (predicting t+2), aux."""
        s = tokens.shape[1]
        cos, sin = self.rope_cos[:s].to(self.head.weight.dtype), self.rope_sin[:s].to(
            self.head.weight.dtype)
        x = self.embed(tokens)
        kls, bals = [], []
        for blk in self.layers:
            x, kl, bal = self._block_train(blk, x, cos, sin)
            kls.append(kl)
            bals.append(bal)
        logits = self.head(self.norm(x))
        m = self._mtp_in(x[:, :-1], tokens[:, 1:])
        m, kl, bal = self._block_train(self.mtp_block, m, cos[:-1], sin[:-1])
        mtp_logits = self.head(self.mtp_norm(m))
        return {"logits": logits, "mtp_logits": mtp_logits, "hidden": x,
                "indexer_kl": torch.stack([*kls, kl]).mean(),
                "balance": torch.stack([*bals, bal]).mean()}

    def _mtp_in(self, h: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        e = self.embed(next_tokens)
        return self.mtp_proj(torch.cat((self.mtp_hnorm(h), self.mtp_enorm(e)), dim=-1))

    # ---- serving path ------------------------------------------------------------------------
    def prepare_inference(self) -> MiniModel:
        """Build the fused serving weights of every attention layer (see MLA.prepare_inference)."""
        for blk in (*self.layers, self.mtp_block):
            blk.attn.prepare_inference()
        return self

    def _rope_at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin rows [N, rope/2] for positions [N], in the model's dtype."""
        dt = self.head.weight.dtype
        return self.rope_cos[positions].to(dt), self.rope_sin[positions].to(dt)

    def _block_flat(self, blk: Block, x, cos, sin, fb: FlatBatch, kv, ik, attn_fn):
        x = x + blk.attn.forward_flat(blk.attn_norm(x), cos, sin, fb, kv, ik, attn_fn)
        return x + blk.ffn(blk.ffn_norm(x), aux=False)[0]

    def forward_flat(self, tokens: torch.Tensor, fb: FlatBatch, cache: KVCache,
                     attn_fn: AttentionFn = torch_sparse_mla
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Main model on N tokens -> (logits [N, V] float32, hidden [N, d] before the final norm)."""
        cos, sin = self._rope_at(fb.positions)
        x = self.embed(tokens)
        for i, blk in enumerate(self.layers):
            x = self._block_flat(blk, x, cos, sin, fb, cache.kv[i], cache.ik[i], attn_fn)
        return self.head(self.norm(x)).float(), x

    def mtp_flat(self, hidden: torch.Tensor, next_tokens: torch.Tensor, fb: FlatBatch,
                 cache: KVCache, attn_fn: AttentionFn = torch_sparse_mla
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """MTP module at positions fb.positions: hidden h_i [N, d] and token t_{i+1} [N]
        -> (logits for t_{i+2} [N, V] float32, MTP hidden [N, d], reused for the next draft)."""
        cos, sin = self._rope_at(fb.positions)
        n = self.cfg.n_layers
        m = self._mtp_in(hidden, next_tokens)
        m = self._block_flat(self.mtp_block, m, cos, sin, fb, cache.kv[n], cache.ik[n], attn_fn)
        return self.head(self.mtp_norm(m)).float(), m


class KVCache:
    """Latent rows and indexer keys for n_layers + 1 (MTP) layers, `slots` x `ctx` rows each.

    One extra scratch slot (index `slots`) absorbs the writes of padding tokens (CUDA graphs).
    """

    def __init__(self, cfg: ModelConfig, slots: int, ctx: int, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        self.slots, self.ctx = slots, ctx
        rows = (slots + 1) * ctx
        self.kv = [torch.zeros(rows, cfg.kv_dim, device=device, dtype=dtype)
                   for _ in range(cfg.n_layers + 1)]
        self.ik = [torch.zeros(rows, cfg.index_dim, device=device, dtype=dtype)
                   for _ in range(cfg.n_layers + 1)]

    @property
    def scratch_slot(self) -> int:
        return self.slots

    def _rows(self, slot: int, n: int) -> torch.Tensor:
        """Row indices of positions 0..n-1 of `slot` (row s * ctx + p, as make_batch writes)."""
        start = slot * self.ctx
        return torch.arange(start, start + n, device=self.kv[0].device)

    def read_rows(self, slot: int, n: int, layers: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the rows of positions 0..n-1 of `slot` in the first `layers` layers:
        (kv [layers, n, kv_dim], ik [layers, n, index_dim]) on the cache's device."""
        rows = self._rows(slot, n)
        kv = torch.stack([self.kv[i].index_select(0, rows) for i in range(layers)])
        ik = torch.stack([self.ik[i].index_select(0, rows) for i in range(layers)])
        return kv, ik

    def write_rows(self, slot: int, kv: torch.Tensor, ik: torch.Tensor) -> None:
        """Write kv [L, n, kv_dim] and ik [L, n, index_dim] as positions 0..n-1 of `slot` in
        the first L layers (the inverse of read_rows, from any device)."""
        rows = self._rows(slot, int(kv.shape[1]))
        for i in range(int(kv.shape[0])):
            self.kv[i].index_copy_(0, rows, kv[i].to(self.kv[i].device))
            self.ik[i].index_copy_(0, rows, ik[i].to(self.ik[i].device))
