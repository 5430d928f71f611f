"""The engine's two sides of prefill/decode disaggregation: a prefill engine exports a prefilled
request's KV rows (`export`), a decode engine installs them into a free slot (`install`) and
goes on decoding as if it had prefilled the prompt itself.

Rows are copied for positions 0..S-1 of every layer (the MTP layer too when the prefill
speculates). The MTP layer's rows the prefill wrote beyond S while drafting a chain are not
sent: a decode step rewrites every such position before any query reads it.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

import torch

from servelab.mini.pd_transfer import KVHandoff, TransferError

if TYPE_CHECKING:
    from servelab.mini.engine import Engine
    from servelab.mini.request import Request


# the size of a CPU torch.Generator's state (what a seeded request's sampler continues from)
_GEN_STATE_BYTES = int(torch.Generator().get_state().numel())


def fingerprint(engine: Engine) -> str:
    """Model identity both sides must share: config, weights (path or random seed), dtype."""
    meta = engine.weights_meta
    ident = {"config": engine.cfg.to_dict(), "weights": meta.get("weights"),
             "seed": meta.get("seed") if meta.get("weights") == "random" else None,
             "dtype": str(engine.cache.kv[0].dtype)}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def _rows(engine: Engine, slot: int, n: int) -> torch.Tensor:
    start = slot * engine.ctx
    return torch.arange(start, start + n, device=engine.device)


def export(engine: Engine, r: Request) -> KVHandoff:
    """The handoff of a request just prefilled (its first token sampled, drafts made)."""
    n = len(r.prompt)
    layers = engine.cfg.n_layers + (1 if engine.k else 0)
    rows = _rows(engine, r.slot, n)
    kv = torch.stack([engine.cache.kv[i].index_select(0, rows) for i in range(layers)]).cpu()
    ik = torch.stack([engine.cache.ik[i].index_select(0, rows) for i in range(layers)]).cpu()
    gen = bytes(r.gen.get_state().numpy().tobytes()) if r.gen is not None else None
    return KVHandoff(room=r.room, prompt=list(r.prompt), first_token=r.last,
                     drafts=list(r.drafts), kv=kv, ik=ik, fingerprint=fingerprint(engine),
                     gen_state=gen)


def check(engine: Engine, h: KVHandoff, prompt: list[int], room: int | None = None) -> None:
    """Refuse a handoff this decode engine cannot continue (TransferError, one line). Whatever
    passes here installs without error: a bad handoff fails its own request, never the engine
    step it would share with other requests."""
    if room is not None and h.room != room:
        raise TransferError(f"asked the prefill server for bootstrap_room {room}, it sent the "
                            f"KV of room {h.room}")
    if h.fingerprint != fingerprint(engine):
        raise TransferError(f"the prefill server serves another model (fingerprint "
                            f"{h.fingerprint}, this decode server {fingerprint(engine)}): give "
                            "both the same --config, --weights and --seed")
    if h.prompt != prompt:
        raise TransferError(f"the KV of bootstrap_room {h.room} is for another prompt "
                            f"({len(h.prompt)} tokens, this request {len(prompt)})")
    cfg = engine.cfg
    want = (len(prompt), cfg.kv_dim), (len(prompt), cfg.index_dim)
    if (tuple(h.kv.shape[1:]), tuple(h.ik.shape[1:])) != want or h.layers < cfg.n_layers:
        raise TransferError(f"KV handoff of shape {list(h.kv.shape)} does not fit this model")
    if engine.k and (h.layers < cfg.n_layers + 1 or len(h.drafts) < engine.k):
        raise TransferError(
            f"this decode server speculates {engine.k} draft token(s) per step but the prefill "
            f"server sent {len(h.drafts)} draft(s){'' if h.layers > cfg.n_layers else ' and no MTP KV'}"
            ": give the prefill server the same --speculative-* flags (as SGLang requires)")
    if h.kv.dtype != engine.cache.kv[0].dtype:
        raise TransferError(f"KV handoff in {h.kv.dtype}, this decode server caches "
                            f"{engine.cache.kv[0].dtype}")
    bad = [t for t in (h.first_token, *h.drafts) if not 0 <= t < cfg.vocab_size]
    if bad:
        raise TransferError(f"KV handoff names token ids {bad[:4]} outside this model's "
                            f"vocabulary of {cfg.vocab_size}")
    if h.gen_state is not None and len(h.gen_state) != _GEN_STATE_BYTES:
        raise TransferError(f"KV handoff's sampler state is {len(h.gen_state)} bytes, this "
                            f"server's is {_GEN_STATE_BYTES}: run the same torch on both sides")


def install(engine: Engine, r: Request) -> None:
    """Write a request's received rows into its slot and set its decoding state."""
    h = r.handoff
    assert h is not None
    n = len(r.prompt)
    rows = _rows(engine, r.slot, n)
    layers = engine.cfg.n_layers + (1 if engine.k else 0)
    for i in range(layers):
        engine.cache.kv[i].index_copy_(0, rows, h.kv[i].to(engine.device))
        engine.cache.ik[i].index_copy_(0, rows, h.ik[i].to(engine.device))
    r.last, r.pos = h.first_token, n
    r.drafts = list(h.drafts[:engine.k])
    if r.gen is not None and h.gen_state is not None:
        r.gen.set_state(torch.frombuffer(bytearray(h.gen_state), dtype=torch.uint8))
    r.handoff = None  # the rows live in the cache now
