"""The prefix cache (SGLang's radix cache, in blocks): the latent KV rows and indexer keys of
token sequences seen before (prompts, and finished requests' prompt + output), kept in a pool
of `page_size`-token blocks, reused by any later prompt that starts with the same tokens,
evicted least recently used when the pool is full.

A block is keyed by (its parent block, its tokens): a chain of blocks from the root is one
prefix, so two prompts share exactly the blocks of their common whole-block prefix (the tree
SGLang's radix cache holds, at page granularity, with exact keys: no hash can collide).

Reuse copies: at admission the matched blocks' rows are copied into the request's own slot
(rows s * ctx + p), and prefill computes only the rest. The attention kernels, CUDA graphs and
the PD handoff read a slot as before and never see the pool; a block can be evicted while a
request that copied it runs (no pinning, no reference counts). The price is one copy per
reused row, measured in docs/MINI.md ("Prefix cache").

What is cached for a block: every layer's rows (the MTP layer's too when speculating) and, when
speculating, the main model's hidden state at the block's last position. The MTP row at position
i reads token i + 1, so a block of positions [b, b + P) keeps the MTP rows of positions
[b - 1, b + P - 1): each depends on the block's chain alone, whatever follows it (two prompts that
share a block and differ right after it would otherwise draft from the first one's row). The
MTP row at the last reused position is recomputed from the hidden state kept, so a reused
prefix drafts exactly what a computed one does.

The engine calls `match` at admission, `load` before the prefill forward (before any `insert`
of the same step can evict what was matched), `insert` after it (the prompt) and when a request
finishes (its prompt and output). This module is given the KV cache, never the Engine.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from servelab.mini.model.config import ModelConfig
from servelab.mini.model.model import KVCache

Key = tuple[int, tuple[int, ...]]  # (parent block id, or -1 at the root; the block's tokens)


@dataclass(slots=True)
class _Block:
    key: Key
    children: int = 0


@dataclass(frozen=True, slots=True)
class Match:
    """The cached blocks a prompt starts with: `tokens` = len(blocks) x page_size."""

    blocks: tuple[int, ...] = ()
    tokens: int = 0


class PrefixCache:
    """A pool of `num_blocks` blocks of `page_size` rows in each of `layers` layers; with `mtp`
    the last of them is the MTP layer (rows one position earlier, hidden states kept)."""

    def __init__(self, cfg: ModelConfig, layers: int, page_size: int, num_blocks: int,
                 device: torch.device | str, dtype: torch.dtype, mtp: bool) -> None:
        if page_size < 1 or num_blocks < 1:
            raise ValueError(f"page_size {page_size} and num_blocks {num_blocks} must be >= 1")
        self.page, self.num_blocks, self.layers = page_size, num_blocks, layers
        rows = num_blocks * page_size
        self.kv = [torch.zeros(rows, cfg.kv_dim, device=device, dtype=dtype)
                   for _ in range(layers)]
        self.ik = [torch.zeros(rows, cfg.index_dim, device=device, dtype=dtype)
                   for _ in range(layers)]
        # the main model's hidden state at each block's last position (for the MTP row there)
        self.hidden = (torch.zeros(num_blocks, cfg.d_model, device=device, dtype=dtype)
                       if mtp else None)
        self.mtp_layer = layers - 1 if mtp else -1
        self._ids: dict[Key, int] = {}
        self._lru: OrderedDict[int, _Block] = OrderedDict()  # block id -> block, oldest first
        self._free = list(range(num_blocks - 1, -1, -1))
        self.evictions = 0

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, layers: int, dtype: torch.dtype) -> int:
        """Pool bytes per cached token (the hidden state, one row per block, not counted)."""
        return layers * (cfg.kv_dim + cfg.index_dim) * dtype.itemsize

    @property
    def cached_blocks(self) -> int:
        return len(self._lru)

    def match(self, prompt: list[int]) -> Match:
        """The longest chain of cached blocks `prompt` starts with, leaving its last token out
        (its logits are needed, so it is always computed); the chain becomes most recent."""
        parent, blocks = -1, []
        for b in range((len(prompt) - 1) // self.page):
            bid = self._ids.get((parent, tuple(prompt[b * self.page:(b + 1) * self.page])))
            if bid is None:
                break
            blocks.append(bid)
            parent = bid
        for bid in blocks:  # root first: the leaf ends most recent
            self._lru.move_to_end(bid)
        return Match(tuple(blocks), len(blocks) * self.page)

    def load(self, cache: KVCache, loads: list[tuple[int, Match]]) -> None:
        """Copy matched blocks into positions 0.. of their slots: (slot, match) pairs."""
        loads = [(s, m) for s, m in loads if m.blocks]
        if not loads:
            return
        dst = torch.cat([self._slot_rows(cache, s, 0, m.tokens) for s, m in loads])
        src = torch.cat([self._block_rows(m.blocks) for _, m in loads])
        if self.mtp_layer >= 0:  # positions 0..c-2 from rows 1.. (row 0 is position -1)
            dst_m = torch.cat([self._slot_rows(cache, s, 0, m.tokens - 1) for s, m in loads])
            src_m = torch.cat([self._block_rows(m.blocks)[1:] for _, m in loads])
        for i in range(self.layers):
            d, s_ = (dst_m, src_m) if i == self.mtp_layer else (dst, src)
            cache.kv[i].index_copy_(0, d, self.kv[i].index_select(0, s_))
            cache.ik[i].index_copy_(0, d, self.ik[i].index_select(0, s_))

    def hidden_at_end(self, m: Match) -> torch.Tensor:
        """[1, d] hidden state at the last matched position (a non-empty match, mtp)."""
        assert self.hidden is not None and m.blocks
        return self.hidden[m.blocks[-1]:m.blocks[-1] + 1]

    def insert(self, cache: KVCache, slot: int, tokens: list[int],
               hidden: Mapping[int, torch.Tensor] | None) -> int:
        """Cache the whole blocks of `tokens`, whose rows are in positions 0.. of `slot`;
        `hidden` (with mtp): the main model's hidden state [d] at block-end positions, where
        this request computed it (a new block needs its own). Evicts least recently used
        leaves when the pool is full, never a block of this sequence. Returns the blocks
        added."""
        parent, chain, new = -1, set(), []
        for b in range(len(tokens) // self.page):
            key = (parent, tuple(tokens[b * self.page:(b + 1) * self.page]))
            bid = self._ids.get(key)
            if bid is None:
                # e.g. a matched block evicted since by another prompt of the same prefill:
                # its rows are in the slot but its hidden state was not computed here
                if self.hidden is not None and (hidden is None
                                                or (b + 1) * self.page - 1 not in hidden):
                    break
                bid = self._allocate(chain)
                if bid is None:
                    break
                self._ids[key] = bid
                self._lru[bid] = _Block(key)
                if parent >= 0:
                    self._lru[parent].children += 1
                new.append((b, bid))
            self._lru.move_to_end(bid)
            chain.add(bid)
            parent = bid
        if not new:
            return 0
        try:
            self._copy_in(cache, slot, new, hidden)
        except BaseException:  # a block registered without its rows would serve garbage
            for _, bid in reversed(new):
                self._drop(bid)
                self._free.append(bid)
            raise
        return len(new)

    def _copy_in(self, cache: KVCache, slot: int, new: list[tuple[int, int]],
                 hidden: Mapping[int, torch.Tensor] | None) -> None:
        """Copy the rows (and hidden states) of new blocks [(block index, block id)] from the
        slot into the pool."""
        if slot < 0 or slot >= cache.slots:
            raise ValueError(f"slot {slot} is not a slot of the KV cache")
        dst = self._block_rows([bid for _, bid in new])
        src = torch.cat([self._slot_rows(cache, slot, b * self.page, self.page) for b, _ in new])
        # the MTP layer one position earlier (block 0's first row, position -1, is never read)
        src_m = (src - 1).clamp_min(slot * cache.ctx)
        for i in range(self.layers):
            s_ = src_m if i == self.mtp_layer else src
            self.kv[i].index_copy_(0, dst, cache.kv[i].index_select(0, s_))
            self.ik[i].index_copy_(0, dst, cache.ik[i].index_select(0, s_))
        if self.hidden is not None:
            assert hidden is not None
            rows = torch.stack([hidden[(b + 1) * self.page - 1] for b, _ in new])
            ids = torch.tensor([bid for _, bid in new], device=self.hidden.device)
            self.hidden.index_copy_(0, ids, rows.to(self.hidden))

    def _drop(self, bid: int) -> None:
        """Forget a leaf block (its id is not freed here)."""
        blk = self._lru.pop(bid)
        del self._ids[blk.key]
        if blk.key[0] >= 0:
            self._lru[blk.key[0]].children -= 1

    def _allocate(self, keep: set[int]) -> int | None:
        """A free block, evicting the least recently used leaf outside `keep` if none is free."""
        if self._free:
            return self._free.pop()
        victim = next((bid for bid, blk in self._lru.items()
                       if blk.children == 0 and bid not in keep), None)
        if victim is None:
            return None
        self._drop(victim)
        self.evictions += 1
        return victim

    def _block_rows(self, blocks) -> torch.Tensor:
        dev = self.kv[0].device
        ids = torch.tensor(list(blocks), dtype=torch.long, device=dev)
        return (ids[:, None] * self.page + torch.arange(self.page, device=dev)).flatten()

    @staticmethod
    def _slot_rows(cache: KVCache, slot: int, start: int, n: int) -> torch.Tensor:
        base = slot * cache.ctx + start
        return torch.arange(base, base + n, device=cache.kv[0].device)
