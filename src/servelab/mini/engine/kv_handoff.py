"""The engine's two sides of prefill/decode disaggregation: a prefill engine exports a prefilled
request's KV rows (`export`), a decode engine checks a received handoff (`check`) and installs it
into the request's slot (`install`), then goes on decoding as if it had prefilled the prompt.

Rows are copied for positions 0..S-1 of every layer (those the prefill reused from its prefix
cache as well: the slot holds them all) (the MTP layer too when the prefill
speculates). The MTP layer's rows the prefill wrote beyond S while drafting a chain are not
sent: a decode step rewrites every such position before any query reads it.

These functions are given the KV cache and what the handoff must match (the model's config, the
draft count, the model fingerprint), never the Engine: the engine calls them, not the reverse.
How a handoff travels between servers (the wire format, the bootstrap port) is the server's
(server/pd/).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from servelab.mini.model.config import ModelConfig
from servelab.mini.model.model import KVCache

if TYPE_CHECKING:
    from servelab.mini.engine.request import Request


# the size of a CPU torch.Generator's state (what a seeded request's sampler continues from)
_GEN_STATE_BYTES = int(torch.Generator().get_state().numel())


class TransferError(Exception):
    """A handoff that cannot be used (malformed, for another model or prompt, or never came);
    `status` is the HTTP status the decode server answers the request with."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class KVHandoff:
    """One prefilled request, ready for a decode server."""

    room: int
    prompt: list[int]
    first_token: int
    drafts: list[int]  # MTP drafts for the first verify step (empty without speculation)
    kv: torch.Tensor  # [L, S, kv_dim]: L = n_layers (+1 with the MTP layer), S = len(prompt)
    ik: torch.Tensor  # [L, S, index_dim]
    fingerprint: str  # model config, weights and dtype: both sides must serve the same model
    gen_state: bytes | None = None  # torch.Generator state after sampling the first token
    cached_tokens: int = 0  # prompt tokens the prefill server reused from its prefix cache

    @property
    def layers(self) -> int:
        return int(self.kv.shape[0])


def fingerprint(cfg: ModelConfig, weights_meta: Mapping, dtype: torch.dtype) -> str:
    """Model identity both sides must share: config, weights (path or random seed), dtype."""
    ident = {"config": cfg.to_dict(), "weights": weights_meta.get("weights"),
             "seed": weights_meta.get("seed") if weights_meta.get("weights") == "random" else None,
             "dtype": str(dtype)}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def layers_sent(cfg: ModelConfig, k: int) -> int:
    """Layers whose rows a handoff carries: the main ones, plus the MTP layer when speculating."""
    return cfg.n_layers + (1 if k else 0)


def export(cache: KVCache, r: Request, layers: int, model_fingerprint: str) -> KVHandoff:
    """The handoff of a request just prefilled (its first token sampled, drafts made)."""
    kv, ik = cache.read_rows(r.slot, len(r.prompt), layers)
    gen = bytes(r.gen.get_state().numpy().tobytes()) if r.gen is not None else None
    return KVHandoff(room=r.room, prompt=list(r.prompt), first_token=r.last,
                     drafts=list(r.drafts), kv=kv.cpu(), ik=ik.cpu(),
                     fingerprint=model_fingerprint, gen_state=gen,
                     cached_tokens=r.cached_tokens)


def check(h: KVHandoff, prompt: list[int], room: int | None, *, cfg: ModelConfig, k: int,
          dtype: torch.dtype, model_fingerprint: str) -> None:
    """Refuse a handoff a decode engine of this model (`cfg`, `k` drafts per step, caching in
    `dtype`) cannot continue (TransferError, one line). Whatever passes here installs without
    error: a bad handoff fails its own request, never the engine step it would share with other
    requests."""
    if room is not None and h.room != room:
        raise TransferError(f"asked the prefill server for bootstrap_room {room}, it sent the "
                            f"KV of room {h.room}")
    if h.fingerprint != model_fingerprint:
        raise TransferError(f"the prefill server serves another model (fingerprint "
                            f"{ascii(h.fingerprint[:40])}, this decode server "
                            f"{model_fingerprint}): give both the same --config, --weights "
                            "and --seed")
    if h.prompt != prompt:
        raise TransferError(f"the KV of bootstrap_room {h.room} is for another prompt "
                            f"({len(h.prompt)} tokens, this request {len(prompt)})")
    want = (len(prompt), cfg.kv_dim), (len(prompt), cfg.index_dim)
    if (tuple(h.kv.shape[1:]), tuple(h.ik.shape[1:])) != want or h.layers < cfg.n_layers:
        raise TransferError(f"KV handoff of shape {list(h.kv.shape)} does not fit this model")
    if k and (h.layers < cfg.n_layers + 1 or len(h.drafts) < k):
        raise TransferError(
            f"this decode server speculates {k} draft token(s) per step but the prefill "
            f"server sent {len(h.drafts)} draft(s){'' if h.layers > cfg.n_layers else ' and no MTP KV'}"
            ": give the prefill server the same --speculative-* flags (as SGLang requires)")
    if h.kv.dtype != dtype:
        raise TransferError(f"KV handoff in {h.kv.dtype}, this decode server caches {dtype}")
    bad = [t for t in (h.first_token, *h.drafts) if not 0 <= t < cfg.vocab_size]
    if bad:
        raise TransferError(f"KV handoff names token ids {bad[:4]} outside this model's "
                            f"vocabulary of {cfg.vocab_size}")
    if h.gen_state is not None:
        _check_gen_state(h.gen_state)
    if not (torch.isfinite(h.kv).all() and torch.isfinite(h.ik).all()):
        raise TransferError(f"the KV of bootstrap_room {h.room} holds NaN or infinite values")


def _check_gen_state(state: bytes) -> None:
    """The sampler state must be one torch accepts: the right length is not enough (an invalid
    mt19937 state of 5056 bytes passed, then failed install() inside the engine step, taking
    the valid requests installed in the same step with it)."""
    if len(state) != _GEN_STATE_BYTES:
        raise TransferError(f"KV handoff's sampler state is {len(state)} bytes, this "
                            f"server's is {_GEN_STATE_BYTES}: run the same torch on both sides")
    try:
        torch.Generator().set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    except (RuntimeError, ValueError) as exc:
        raise TransferError(f"KV handoff's sampler state is not a valid generator state "
                            f"({str(exc).splitlines()[0][:80] if str(exc) else 'refused'})"
                            ) from None


def install(cache: KVCache, r: Request, layers: int, k: int) -> None:
    """Write a request's received rows (its first `layers` layers) into its slot and set its
    decoding state (`k` drafts per step)."""
    h = r.handoff
    assert h is not None
    cache.write_rows(r.slot, h.kv[:layers], h.ik[:layers])
    r.last, r.pos = h.first_token, len(r.prompt)
    r.drafts = list(h.drafts[:k])
    r.cached_tokens = h.cached_tokens  # reported as the prefill server's reuse
    if r.gen is not None and h.gen_state is not None:
        r.gen.set_state(torch.frombuffer(bytearray(h.gen_state), dtype=torch.uint8))
    r.handoff = None  # the rows live in the cache now
