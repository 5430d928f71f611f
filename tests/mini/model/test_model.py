"""Model shapes and KV-cache correctness: the serving path (flat tokens, latent KV cache, sparse
window + top-k selection) must reproduce the dense training path, whether a sequence is
prefilled at once or decoded token by token, and under CUDA-graph-style static padding."""

from __future__ import annotations

import torch

from servelab.mini.model.config import get_config
from servelab.mini.model.model import KVCache, MiniModel, make_batch

# fp32 on CPU: the paths differ only in summation order; 1e-4 is ~100x the observed 1e-6 and
# far below a changed top-k selection (which moves logits by O(0.1)).
ATOL = 1e-4


def _model(name: str = "micro", **kw) -> MiniModel:
    torch.manual_seed(0)
    return MiniModel(get_config(name, **kw)).eval().prepare_inference()


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    err = (a - b).abs()
    bad = (err > ATOL).nonzero()
    assert not len(bad), f"{what}: {len(bad)} mismatches, first at {bad[:3].tolist()}, max {err.max():.3g}"


def test_shapes_and_sizes():
    m = _model()
    c = m.cfg
    tok = torch.randint(0, 256, (3, 11))
    out = m.forward_train(tok)
    assert out["logits"].shape == (3, 11, c.vocab_size)
    assert out["mtp_logits"].shape == (3, 10, c.vocab_size)
    assert out["hidden"].shape == (3, 11, c.d_model)
    tiny = get_config("tiny")
    n = sum(p.numel() for p in MiniModel(tiny).parameters())
    assert 1e6 < n < 5e6, n  # "a few million"; bf16 checkpoint <= 10 MB
    flash = get_config("flash")  # V4-Flash attention shapes (docs/FIELD.md)
    assert (flash.n_heads, flash.kv_dim, flash.value_dim, flash.attend_k) == (64, 512, 512, 640)


@torch.no_grad()
def test_prefill_and_incremental_decode_equal_full_recompute():
    m = _model()
    c = m.cfg
    s, ctx = 23, 32  # window 4 + top-k 4: sparse selection active after position 8
    assert s > c.attend_k
    tok = torch.randint(0, 256, (1, s))
    ref = m.forward_train(tok)
    cache = KVCache(c, 2, ctx, "cpu", torch.float32)
    fb = make_batch(c, torch.full((s,), 1), torch.arange(s), ctx, s)
    logits, hidden = m.forward_flat(tok[0], fb, cache)
    _close(logits, ref["logits"][0], "prefill vs recompute")
    steps = []
    for p in range(s):  # slot 0, one token at a time
        fb1 = make_batch(c, torch.tensor([0]), torch.tensor([p]), ctx, p + 1)
        steps.append(m.forward_flat(tok[0, p:p + 1], fb1, cache)[0])
    _close(torch.cat(steps), ref["logits"][0], "incremental decode vs recompute")
    # MTP head over the cached prefix equals its training path
    fbm = make_batch(c, torch.full((s - 1,), 1), torch.arange(s - 1), ctx, s)
    mtp, _ = m.mtp_flat(hidden[:-1], tok[0, 1:], fbm, cache)
    _close(mtp, ref["mtp_logits"][0], "MTP serving vs training path")


@torch.no_grad()
def test_sparse_selection_changes_output():
    """The window + top-k mask is real: with the context beyond it, a dense model differs."""
    m = _model()
    dense = _model(window=64, topk=64)
    tok = torch.randint(0, 256, (1, 30))
    a = m.forward_train(tok)["logits"][0]
    b = dense.forward_train(tok)["logits"][0]
    k = m.cfg.attend_k
    assert torch.allclose(a[:k], b[:k], atol=ATOL)  # identical while the context <= k
    assert (a[k + 2:] - b[k + 2:]).abs().max() > 1e-2


@torch.no_grad()
def test_static_full_context_candidates_match_eager():
    """CUDA-graph style (candidates = the whole slot, padded rows on a scratch slot)."""
    m = _model()
    c = m.cfg
    ctx, s = 40, 20
    tok = torch.randint(0, 256, (s,))
    cache = KVCache(c, 1, ctx, "cpu", torch.float32)
    fb = make_batch(c, torch.zeros(s, dtype=torch.long), torch.arange(s), ctx, s)
    eager = m.forward_flat(tok, fb, cache)[0]
    pad = 5
    slots = torch.cat((torch.zeros(s, dtype=torch.long), torch.full((pad,), cache.scratch_slot)))
    pos = torch.cat((torch.arange(s), torch.zeros(pad, dtype=torch.long)))
    toks = torch.cat((tok, torch.zeros(pad, dtype=torch.long)))
    static = m.forward_flat(toks, make_batch(c, slots, pos, ctx, ctx), cache)[0][:s]
    _close(static, eager, "static full-slot candidates vs eager")




def test_cache_rows_read_back_what_was_written():
    """KVCache.read_rows / write_rows (the KV handoff's copy): positions 0..n-1 of one slot, the
    first L layers, nothing else touched."""
    cfg = get_config("micro")
    cache = KVCache(cfg, 3, 16, "cpu", torch.float32)
    layers, n = cfg.n_layers, 5
    kv = torch.randn(layers, n, cfg.kv_dim)
    ik = torch.randn(layers, n, cfg.index_dim)
    cache.write_rows(1, kv, ik)
    got_kv, got_ik = cache.read_rows(1, n, layers)
    assert torch.equal(got_kv, kv) and torch.equal(got_ik, ik)
    assert not cache.kv[layers].any()  # the MTP layer was not written
    for t in (*cache.kv[:layers], *cache.ik[:layers]):
        rows = t.abs().sum(-1).nonzero().flatten().tolist()
        assert rows == list(range(16, 16 + n))  # slot 1: rows 16..20
