"""CUDA graphs for the engine's forward passes (`--cuda-graph`).

The main forward and the MTP forward are captured once per padded token count (bucket). A step
with n tokens copies its inputs into the static buffers of the smallest bucket >= n, pads the
rest with dummy tokens that write to the cache's scratch slot, and replays: one
`cudaGraphLaunch` per forward instead of hundreds of kernel launches. Inside a graph the
candidate range is the whole slot (static shape); the indexer then picks exactly the positions
the eager path picks (invalid candidates score -inf), so outputs match up to summation order.
Larger steps (long prefills) run eagerly.
"""

from __future__ import annotations

import torch

from servelab.mini.model.model import make_batch

BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


class GraphRunner:
    """Captured main and MTP forwards for each bucket up to `max_tokens`."""

    def __init__(self, engine, max_tokens: int) -> None:
        self.e = engine
        self.buckets = [b for b in BUCKETS if b < max_tokens] + [max_tokens]
        self.max_tokens = max_tokens
        self.graphs: dict[tuple[str, int], tuple[torch.cuda.CUDAGraph, dict, tuple]] = {}
        self.pool = None

    def fits(self, n: int) -> bool:
        return n <= self.max_tokens and bool(self.graphs)

    def _inputs(self, n: int) -> dict[str, torch.Tensor]:
        dev, d = self.e.device, self.e.cfg.d_model
        return {"tokens": torch.zeros(n, dtype=torch.long, device=dev),
                "slots": torch.full((n,), self.e.cache.scratch_slot, dtype=torch.long,
                                    device=dev),
                "positions": torch.zeros(n, dtype=torch.long, device=dev),
                "hidden": torch.zeros(n, d, dtype=self.e.model.head.weight.dtype, device=dev)}

    def _fn(self, kind: str, x: dict[str, torch.Tensor]):
        e = self.e
        fb = make_batch(e.cfg, x["slots"], x["positions"], e.ctx, e.ctx)
        if kind == "main":
            return e.model.forward_flat(x["tokens"], fb, e.cache, e.attn_fn)
        return e.model.mtp_flat(x["hidden"], x["tokens"], fb, e.cache, e.attn_fn)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket (largest first, sharing one memory pool)."""
        kinds = ("main", "mtp") if self.e.k else ("main",)
        if self.e.device.type != "cuda":  # CPU: same static buffers and padding, no capture
            for kind in kinds:
                for n in self.buckets:
                    self.graphs[(kind, n)] = (None, self._inputs(n), None)
            return
        side = torch.cuda.Stream()
        for kind in kinds:
            for n in reversed(self.buckets):
                x = self._inputs(n)
                # The buffers are filled (scratch slot, position 0) on the current stream: the
                # side stream must wait for that before its warm-up reads them. Without this
                # wait the warm-up could read the allocator's stale bytes as slots/positions
                # and write cache rows out of range (index_copy_ device assert on the H200).
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):
                        self._fn(kind, x)
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool):
                    out = self._fn(kind, x)
                if self.pool is None:
                    self.pool = g.pool()
                self.graphs[(kind, n)] = (g, x, out)
        torch.cuda.synchronize()

    def _replay(self, kind: str, tokens, slots, positions, hidden=None):
        n = tokens.shape[0]
        b = next(b for b in self.buckets if b >= n)
        g, x, out = self.graphs[(kind, b)]
        x["tokens"][:n].copy_(tokens)
        x["slots"][:n].copy_(slots)
        x["positions"][:n].copy_(positions)
        if n < b:
            x["tokens"][n:].zero_()
            x["slots"][n:].fill_(self.e.cache.scratch_slot)
            x["positions"][n:].zero_()
        if hidden is not None:
            x["hidden"][:n].copy_(hidden)
        if g is None:
            out = self._fn(kind, x)
        else:
            g.replay()
        return out[0][:n], out[1][:n]

    def forward(self, tokens, slots, positions):
        """Main model: (logits [n, V], hidden [n, d], None); views of static outputs."""
        return (*self._replay("main", tokens, slots, positions), None)

    def mtp(self, hidden, next_tokens, slots, positions):
        """MTP head: (logits [n, V], hidden [n, d]); views of static outputs."""
        return self._replay("mtp", next_tokens, slots, positions, hidden)
