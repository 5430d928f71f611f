"""The batched phases of one engine step, over the model and its KV cache: prefill (reusing
the prefix cache's blocks), decode, the speculative verify, MTP drafting, sampling, and the
prefill server's export.

`Phases` is the Engine's base class (engine.py keeps the public API, the scheduler and the
requests' output): it uses the Engine's model, cache, prefix cache, stats and its per-request
output methods (`_append`, `_finish`, `_fail`), declared below for the reader and the checker.
Kept apart so that the scheduler and the model math each read in one file.
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING

import torch

from servelab.mini.engine import kv_handoff
from servelab.mini.engine.request import Request, Stats
from servelab.mini.engine.sampling import accept_drafts, mask_logits, sample_row, target_probs
from servelab.mini.model import tokenizer as tk
from servelab.mini.model.attention import AttentionFn
from servelab.mini.model.config import ModelConfig
from servelab.mini.model.model import KVCache, make_batch

if TYPE_CHECKING:
    from servelab.mini.engine.graphs import GraphRunner
    from servelab.mini.engine.prefix_cache import PrefixCache
    from servelab.mini.model.model import MiniModel


class Phases:
    """Prefill, decode and verify over the Engine's model (see the module's docstring)."""

    model: MiniModel
    cache: KVCache
    prefix: PrefixCache | None
    graphs: GraphRunner | None
    stats: Stats
    device: torch.device
    fingerprint: str
    k: int
    ctx: int
    cfg: ModelConfig
    attn_fn: AttentionFn

    def _append(self, r: Request, toks: list[int]) -> None: ...
    def _finish(self, r: Request, reason: str, error: str | None = None) -> None: ...
    def _fail(self, r: Request, why: str) -> None: ...

    def _ids(self, xs: list[int]) -> torch.Tensor:
        """Token ids, slots or positions as a long tensor on the engine's device."""
        return torch.tensor(xs, dtype=torch.long, device=self.device)

    def _forward(self, tokens: list[int], slots: list[int], positions: list[int]):
        t, s, p = self._ids(tokens), self._ids(slots), self._ids(positions)
        self.stats.forward_tokens += len(tokens)
        if self.graphs is not None and self.graphs.fits(len(tokens)):
            return self.graphs.forward(t, s, p)
        fb = make_batch(self.cfg, s, p, self.ctx, max(positions) + 1)
        return (*self.model.forward_flat(t, fb, self.cache, self.attn_fn), fb)

    def _mtp(self, hidden: torch.Tensor, next_tokens: list[int], slots: list[int],
             positions: list[int], fb=None) -> tuple[list[int], torch.Tensor]:
        """MTP head at `positions`; returns (its argmax draft per row, its hidden per row)."""
        nt = self._ids(next_tokens)
        if self.graphs is not None and self.graphs.fits(len(next_tokens)):
            logits, m = self.graphs.mtp(hidden, nt, self._ids(slots), self._ids(positions))
        else:
            if fb is None:
                fb = make_batch(self.cfg, self._ids(slots), self._ids(positions), self.ctx,
                                max(positions) + 1)
            logits, m = self.model.mtp_flat(hidden, nt, fb, self.cache, self.attn_fn)
        logits[:, tk.BOS:] = float("-inf")  # drafts: bytes only (EOS drafts are rare, cheap)
        return logits.argmax(-1).tolist(), m

    def _prefill(self, reqs: list[Request]) -> None:
        """Prefill each prompt past its cached prefix (copied into its slot first), sample its
        first token, draft with the MTP head, then cache the prompt's whole blocks."""
        slot_of = [r.slot for r in reqs]  # a request that ends at its first token frees its
        # slot at once; its rows stay there until the next admission, for MTP and the insert
        if self.prefix is not None:
            self.prefix.load(self.cache, [(r.slot, r.match) for r in reqs])
        tokens, slots, positions, last_rows = [], [], [], []
        for r in reqs:
            c = r.match.tokens
            tokens += r.prompt[c:]
            slots += [r.slot] * (len(r.prompt) - c)
            positions += range(c, len(r.prompt))
            last_rows.append(len(tokens) - 1)
        logits, hidden, fb = self._forward(tokens, slots, positions)
        if self.graphs is not None:  # a view of the graph's static output: MTP replays next
            hidden = hidden.clone()
        rows = torch.tensor(last_rows, device=logits.device)
        firsts = self._sample(reqs, logits[rows])
        for r, t in zip(reqs, firsts, strict=True):
            self.stats.prompt_tokens += len(r.prompt)
            if self.prefix is not None:
                self.stats.prefix_cache_queries += len(r.prompt)
                self.stats.prefix_cache_hits += r.match.tokens
            if t is None:
                continue
            r.last, r.pos = t, len(r.prompt)
            if r.export is None:  # a prefill server's requests end in _export, after drafting
                self._append(r, [t])
        if self.k:
            self._prefill_mtp(reqs, slot_of, firsts, hidden, slots, positions, fb, last_rows)
        if self.prefix is not None:
            start = 0
            for r, slot in zip(reqs, slot_of, strict=True):
                c = r.match.tokens
                if self.k:
                    self._keep_block_hidden(r, hidden[start:start + len(r.prompt) - c], c)
                    r.mtp_upto = len(r.prompt)
                self.prefix.insert(self.cache, slot, r.prompt, r.block_hidden)
                start += len(r.prompt) - c
        for r in reqs:
            if r.export is not None and r.finish is None:
                self._export(r)

    def _keep_block_hidden(self, r: Request, hidden: torch.Tensor, first: int) -> None:
        """Keep the hidden states [n, d] of positions first.. that end a prefix-cache block."""
        assert self.prefix is not None
        page = self.prefix.page
        ends = [p for p in range(first, first + hidden.shape[0]) if (p + 1) % page == 0]
        if ends:
            rows = hidden.index_select(0, torch.tensor(ends, device=hidden.device) - first)
            r.block_hidden.update(zip(ends, rows.unbind(0), strict=True))

    def _cache_finished(self, r: Request) -> None:
        """Cache a finished request's prompt and output, as SGLang caches a finished request:
        a conversation's next turn resends both. Only rows written with the sequence's own
        tokens are valid: positions < pos (fed), and with MTP < mtp_upto (a request that
        ends in a verify step skips that step's MTP pass; chained drafts wrote past it)."""
        if self.prefix is None or r.slot < 0 or r.pos < 0:
            return
        seq = r.prompt + r.out
        n = min(r.pos, len(seq), r.mtp_upto + 1 if self.k else len(seq))
        try:
            self.prefix.insert(self.cache, r.slot, seq[:n], r.block_hidden)
        except Exception:  # noqa: BLE001 - the request is answered; the cache stays as it was
            traceback.print_exc()
        r.block_hidden = {}

    def _prefill_mtp(self, reqs: list[Request], slot_of: list[int], firsts: list[int | None],
                     hidden: torch.Tensor, slots: list[int], positions: list[int], fb,
                     last_rows: list[int]) -> None:
        """MTP over every computed prompt position i: (h_i, t_{i+1}); the last row drafts
        t_{S+1}. With a cached prefix of c tokens position c - 1 is computed too (its token
        c + 1 lies past the matched blocks), from the hidden state the cache kept."""
        if not any(r.match.tokens for r in reqs):
            nxt = []
            for r, t in zip(reqs, firsts, strict=True):
                nxt += r.prompt[1:] + [t if t is not None else tk.EOS]
            drafts, m = self._mtp(hidden, nxt, slots, positions, fb)
            self._set_drafts(reqs, [drafts[i] for i in last_rows],
                             m[torch.tensor(last_rows, device=m.device)])
            return
        assert self.prefix is not None
        hs, nxt, m_slots, m_pos, m_last, start = [], [], [], [], [], 0
        for r, slot, t in zip(reqs, slot_of, firsts, strict=True):
            c, n = r.match.tokens, len(r.prompt)
            if c:
                hs.append(self.prefix.hidden_at_end(r.match))
            hs.append(hidden[start:start + n - c])
            start += n - c
            first = max(c - 1, 0)
            nxt += r.prompt[first + 1:] + [t if t is not None else tk.EOS]
            m_slots += [slot] * (n - first)
            m_pos += range(first, n)
            m_last.append(len(m_pos) - 1)
        drafts, m = self._mtp(torch.cat(hs), nxt, m_slots, m_pos)
        self._set_drafts(reqs, [drafts[i] for i in m_last],
                         m[torch.tensor(m_last, device=m.device)])

    def _export(self, r: Request) -> None:
        """Prefill server: hand the request's KV on, then end it after its first token."""
        try:
            layers = kv_handoff.layers_sent(self.cfg, self.k)
            r.export(kv_handoff.export(self.cache, r, layers, self.fingerprint))
        except Exception as exc:  # noqa: BLE001 - this request only
            self._fail(r, f"KV export failed: {type(exc).__name__}: {str(exc)[:200]}")
            return
        self._append(r, [r.last])
        if r.finish is None:
            self._finish(r, "length")

    def _set_drafts(self, reqs: list[Request], d1: list[int], m: torch.Tensor) -> None:
        """Store d_1 and run the MTP head k-1 more times (EAGLE chain) for live requests."""
        live = [i for i, r in enumerate(reqs) if r.finish is None]
        reqs = [reqs[i] for i in live]
        for r, d in zip(reqs, [d1[i] for i in live], strict=True):
            r.drafts = [d]
        if not reqs or self.k == 1:
            return
        m = m[torch.tensor(live, device=m.device)]
        for j in range(1, self.k):
            toks = [r.drafts[-1] for r in reqs]
            d, m = self._mtp(m, toks, [r.slot for r in reqs], [r.pos + j - 1 for r in reqs])
            for r, t in zip(reqs, d, strict=True):
                r.drafts.append(t)

    def _allow_eos(self, reqs: list[Request], offsets: list[int]) -> torch.Tensor:
        allow = [not r.params.ignore_eos and len(r.out) + o >= r.params.min_tokens
                 for r, o in zip(reqs, offsets, strict=True)]
        return torch.tensor(allow, device=self.device)

    def _sample(self, reqs: list[Request], logits: torch.Tensor) -> list[int | None]:
        """One token per request from logits [len(reqs), V]; None for a request whose sampling
        failed (that request is failed, the others keep their tokens)."""
        logits = mask_logits(logits, self._allow_eos(reqs, [0] * len(reqs)))
        out: list[int | None] = list(logits.argmax(-1).tolist())
        for i, r in enumerate(reqs):
            if not r.params.greedy:
                try:
                    out[i] = sample_row(target_probs(logits[i:i + 1], r.params)[0].cpu(), r.gen)
                except Exception as exc:  # noqa: BLE001 - this request only
                    self._fail(r, f"sampling failed: {type(exc).__name__}: {str(exc)[:200]}")
                    out[i] = None
        return out

    def _decode(self, reqs: list[Request]) -> None:
        if not self.k:
            logits, _, _ = self._forward([r.last for r in reqs], [r.slot for r in reqs],
                                         [r.pos for r in reqs])
            for r, t in zip(reqs, self._sample(reqs, logits), strict=True):
                if t is None:
                    continue
                r.last, r.pos = t, r.pos + 1
                self._append(r, [t])
            return
        k = self.k
        tokens, slots, positions = [], [], []
        for r in reqs:
            tokens += [r.last, *r.drafts]
            slots += [r.slot] * (k + 1)
            positions += range(r.pos, r.pos + k + 1)
        logits, hidden, _ = self._forward(tokens, slots, positions)
        offs = [j for _ in reqs for j in range(k + 1)]
        rep = [r for r in reqs for _ in range(k + 1)]
        logits = mask_logits(logits, self._allow_eos(rep, offs))
        if any(not r.params.greedy for r in reqs):
            logits = logits.cpu()
        m_rows, m_tokens, m_slots, m_pos, last_rows, live = [], [], [], [], [], []
        for i, r in enumerate(reqs):
            try:
                got = accept_drafts(logits[i * (k + 1):(i + 1) * (k + 1)], r.drafts, r.params,
                                    r.gen)
            except Exception as exc:  # noqa: BLE001 - this request only
                self._fail(r, f"sampling failed: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            a = len(got) - 1
            self.stats.verified(k, a)
            r.spec_verify_ct += 1
            p = r.pos
            if self.prefix is not None:  # for caching its blocks when it finishes
                self._keep_block_hidden(r, hidden[i * (k + 1):i * (k + 1) + a + 1], p)
            r.last, r.pos = got[-1], p + len(got)
            self._append(r, got)
            if r.finish is not None:
                continue
            live.append(r)
            # MTP inputs for positions p..p+a: (h_{p+j}, y_j); the last row drafts t_{p+a+2}.
            m_rows += range(i * (k + 1), i * (k + 1) + a + 1)
            m_tokens += got
            m_slots += [r.slot] * (a + 1)
            m_pos += range(p, p + a + 1)
            last_rows.append(len(m_rows) - 1)
        if not live:
            return
        h = hidden[torch.tensor(m_rows, device=hidden.device)]
        drafts, m = self._mtp(h, m_tokens, m_slots, m_pos)
        for r in live:
            r.mtp_upto = r.pos  # MTP rows of positions < pos now read the sequence's tokens
        self._set_drafts(live, [drafts[i] for i in last_rows],
                         m[torch.tensor(last_rows, device=m.device)])

