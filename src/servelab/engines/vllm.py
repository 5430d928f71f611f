"""vLLM: `vllm serve MODEL`; `/health`, `/metrics` with `vllm:spec_decode_*` counters.

Speculative decoding is one JSON flag, `--speculative-config '{"method": "mtp",
"num_speculative_tokens": 1}'` (vllm/config/speculative.py: the per-model MTP names such as
`deepseek_mtp` are deprecated there and rewritten to `mtp` with a warning).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from servelab.engines.base import Engine, FlagValue, ProcessConfig, ProcessPlan, render_flags

_FLAGS = frozenset(
    """
tokenizer tokenizer-mode trust-remote-code revision served-model-name dtype kv-cache-dtype
quantization load-format download-dir max-model-len gpu-memory-utilization max-num-seqs
max-num-batched-tokens block-size swap-space seed enforce-eager compilation-config
cuda-graph-sizes speculative-config enable-chunked-prefill no-enable-chunked-prefill
enable-prefix-caching no-enable-prefix-caching tensor-parallel-size pipeline-parallel-size
data-parallel-size enable-expert-parallel enable-eplb all2all-backend kv-transfer-config
disable-log-requests enable-log-requests disable-log-stats async-scheduling attention-backend
distributed-executor-backend max-logprobs generation-config override-generation-config
cudagraph-capture-sizes max-cudagraph-capture-size kv-cache-memory-bytes enable-dbo
decode-context-parallel-size disable-custom-all-reduce
""".split()
)
# names checked against vllm/engine/arg_utils.py (EngineArgs.add_cli_args): cuda-graph-sizes is
# deprecated there for cudagraph-capture-sizes; disable-log-requests for enable-log-requests


class VLLM(Engine):
    """`vllm serve MODEL --host H --port P ...`."""

    name = "vllm"
    roles = ("server",)
    known_flags = _FLAGS
    info_path = "/version"
    conflicts = (
        ("enable-prefix-caching", "no-enable-prefix-caching"),
        ("enable-chunked-prefill", "no-enable-chunked-prefill"),
        ("enforce-eager", "compilation-config"),
    )

    def command(
        self, proc: ProcessConfig, model: str, peers: Mapping[str, ProcessPlan]
    ) -> list[str]:
        return [
            "vllm",
            "serve",
            model,
            "--host",
            proc.host,
            "--port",
            str(proc.port),
            *render_flags(proc.flags),
        ]

    def rules(self, model: str, role: str, flags: Mapping[str, FlagValue]) -> list[str]:
        raw = flags.get("speculative-config")
        if raw is None or raw is False:
            return []
        try:
            cfg = json.loads(str(raw))
        except ValueError as exc:
            return [f"speculative-config is not JSON ({exc})"]
        if not isinstance(cfg, dict) or "method" not in cfg:
            return ["speculative-config needs a 'method' (e.g. \"mtp\")"]
        return []
