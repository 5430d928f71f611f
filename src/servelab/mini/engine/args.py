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
    disable_radix_cache: bool = False  # SGLang's flag: the prefix cache is on by default
    page_size: int = 16  # tokens per prefix-cache block (whole blocks are reused)
    # prefix-cache pool, in tokens (None: as many as the slots hold, max_running_requests x
    # context_length); it is memory of its own beside the slots (prefix_cache.py says why)
    prefix_cache_tokens: int | None = None

    @property
    def radix_cache_blocks(self) -> int:
        """Blocks of the prefix-cache pool (0: no prefix cache; a decode server never
        prefills, so it keeps none)."""
        if self.disable_radix_cache or self.disaggregation_mode == "decode":
            return 0
        tokens = self.prefix_cache_tokens
        if tokens is None:
            tokens = self.max_running_requests * self.context_length
        return -(-tokens // self.page_size)

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
        if self.page_size < 1:
            raise UserError(f"--page-size {self.page_size}: must be >= 1")
        if self.prefix_cache_tokens is not None and self.prefix_cache_tokens < self.page_size:
            raise UserError(f"a prefix cache of {self.prefix_cache_tokens} tokens holds no "
                            f"block of --page-size {self.page_size}")
