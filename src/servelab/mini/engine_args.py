"""The engine's arguments: one frozen record, built by `servelab serve` (cli/serve.py) from its
typed flags (serve_args.py) and by tests and benchmarks directly. Names follow SGLang's server
arguments. Kept apart from engine.py so that reading what an engine is configured with does not
mean reading its scheduler."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineArgs:
    """Server/engine arguments; flag names follow SGLang (see cli/serve.py)."""

    config: str = "tiny"
    weights: str | None = None
    random_weights: bool = False
    device: str = "cpu"
    max_running_requests: int = 8
    context_length: int = 1024
    speculative_algorithm: str | None = None
    speculative_num_steps: int = 1
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int = 2
    cuda_graph: bool = False
    attention_backend: str = "torch"
    seed: int = 0
    num_threads: int = 1
    max_prefill_tokens: int = 4096
    disaggregation_mode: str = "null"  # "prefill": export KV after prefill; "decode": install it

    @property
    def num_drafts(self) -> int:
        """Draft tokens proposed per verify step (0 without speculation)."""
        return self.speculative_num_steps if self.speculative_algorithm else 0
