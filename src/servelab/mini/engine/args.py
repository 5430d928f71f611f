"""The engine's arguments: one frozen record, built by `servelab serve` (cli/serve.py) from its
typed flags (server/args.py) and by tests and benchmarks directly. Names follow SGLang's server
arguments. Kept apart from engine.py so that reading what an engine is configured with does not
mean reading its scheduler."""

from __future__ import annotations

from dataclasses import dataclass

from servelab.errors import UserError


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

    def check(self, cuda_available: bool) -> None:
        """Refuse (UserError) a combination the engine cannot run, before anything is loaded;
        `cuda_available`: whether torch sees a CUDA device (this module does not import it)."""
        if self.speculative_algorithm and self.speculative_eagle_topk != 1:
            raise UserError("only --speculative-eagle-topk 1 is supported (a chain of drafts)")
        if self.device.startswith("cuda") and not cuda_available:
            raise UserError("--device cuda but torch sees no CUDA device; use --device cpu")
        if self.config == "flash" and not self.device.startswith("cuda"):
            raise UserError("--config flash (1.5 B random bf16 parameters) is for --device cuda; "
                            "use --config tiny on the CPU")
        if self.cuda_graph and not self.device.startswith("cuda"):
            raise UserError("--cuda-graph needs --device cuda")
