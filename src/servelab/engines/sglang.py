"""SGLang: `python -m sglang.launch_server`, and `sglang_router` for prefill/decode disaggregation.

Flag names follow SGLang's `ServerArgs` (python/sglang/srt/server_args.py). The server describes
itself at `/server_info` (`/get_server_info` before it); acceptance over a window comes from the
`sglang:spec_accept_length` gauge (with --enable-metrics).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from servelab.engines.base import (
    Engine,
    FlagValue,
    ProcessConfig,
    ProcessPlan,
    render_flags,
    spec_window,
)

_SERVER_FLAGS = frozenset(
    """
model-path tokenizer-path tokenizer-mode skip-tokenizer-init load-format trust-remote-code
context-length is-embedding revision served-model-name chat-template dtype kv-cache-dtype
quantization quantization-param-path mem-fraction-static max-running-requests max-total-tokens
chunked-prefill-size max-prefill-tokens schedule-policy schedule-conservativeness page-size
tp-size tensor-parallel-size pp-size dp-size data-parallel-size ep-size expert-parallel-size
enable-dp-attention enable-dp-lm-head moe-a2a-backend moe-runner-backend deepep-mode
enable-eplb ep-num-redundant-experts nnodes node-rank dist-init-addr random-seed log-level
log-requests enable-metrics attention-backend prefill-attention-backend decode-attention-backend
sampling-backend grammar-backend nsa-prefill-backend nsa-decode-backend
disable-cuda-graph cuda-graph-max-bs cuda-graph-bs disable-cuda-graph-padding
enable-torch-compile torch-compile-max-bs disable-radix-cache disable-overlap-schedule
num-continuous-decode-steps enable-mixed-chunk enable-two-batch-overlap
speculative-algorithm speculative-draft-model-path speculative-num-steps speculative-eagle-topk
speculative-num-draft-tokens speculative-accept-threshold-single speculative-accept-threshold-acc
speculative-token-map speculative-attention-mode
disaggregation-mode disaggregation-bootstrap-port disaggregation-transfer-backend
disaggregation-ib-device pp-max-micro-batch-size watchdog-timeout stream-interval base-gpu-id
enable-nccl-nvls enable-symm-mem disable-custom-all-reduce pipeline-parallel-size ep
dsa-prefill-backend dsa-decode-backend disable-decode-cuda-graph disable-prefill-cuda-graph
cuda-graph-max-bs-decode cuda-graph-backend-decode speculative-draft-model
engine-info-bootstrap-port nccl-port
""".split()
)
# Checked against sgl-project/sglang python/sglang/srt/server_args.py (ServerArgs fields, flag =
# field name with '-'): there is no enable-custom-all-reduce, the PP micro-batch flag is
# pp-max-micro-batch-size; nsa-*-backend are deprecated aliases of dsa-*-backend.

# sgl-project/sglang sgl-router/py_src/sglang_router/router_args.py (RouterArgs.add_cli_args)
_ROUTER_FLAGS = frozenset(
    """
policy prefill-policy decode-policy worker-startup-timeout-secs request-timeout-secs
max-concurrent-requests log-level prometheus-port prometheus-host cache-threshold
balance-abs-threshold balance-rel-threshold max-payload-size retry-max-retries disable-retries
disable-circuit-breaker health-check-interval-secs queue-size queue-timeout-secs
""".split()
)

_SPEC_FLAGS = (
    "speculative-num-steps",
    "speculative-eagle-topk",
    "speculative-num-draft-tokens",
    "speculative-draft-model-path",
)


class SGLang(Engine):
    """`python -m sglang.launch_server`; router `python -m sglang_router.launch_router`."""

    name = "sglang"
    roles = ("server", "prefill", "decode", "router")
    known_flags = _SERVER_FLAGS
    # current SGLang serves /server_info and logs a deprecation warning for /get_server_info
    # (python/sglang/srt/entrypoints/http_server.py); older versions have only the latter
    info_path = "/server_info"
    conflicts = (
        ("disable-cuda-graph", "cuda-graph-max-bs"),
        ("disable-cuda-graph", "cuda-graph-bs"),
    )

    def info(self, url: str) -> dict[str, Any] | None:
        """`/server_info`, or `/get_server_info` on SGLang versions without it."""
        return super().info(url) or self._json(url, "/get_server_info")

    def flags_for(self, role: str) -> frozenset[str] | None:
        return _ROUTER_FLAGS if role == "router" else _SERVER_FLAGS

    def command(
        self, proc: ProcessConfig, model: str, peers: Mapping[str, ProcessPlan]
    ) -> list[str]:
        host_port = ["--host", proc.host, "--port", str(proc.port)]
        if proc.role == "router":
            argv = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
            for plan in peers.values():
                if plan.role == "prefill":
                    argv += ["--prefill", plan.url]
                    boot = proc.extra.get(f"bootstrap_port:{plan.port}")
                    if boot:
                        argv.append(str(boot))
                elif plan.role == "decode":
                    argv += ["--decode", plan.url]
            return argv + host_port + render_flags(proc.flags)
        argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, *host_port]
        if proc.role in ("prefill", "decode"):
            argv += ["--disaggregation-mode", proc.role]
        return argv + render_flags(proc.flags)

    def acceptance(
        self, before: Mapping[str, float] | None, after: Mapping[str, float] | None
    ) -> dict[str, float | str | None]:
        """SGLang exports acceptance as gauges (`sglang:spec_accept_length`, `..._rate`), not
        counters: the value after the window is the server's recent average, not a window delta."""
        out = spec_window(before, after)
        if out["accept_length"] is not None or not after:
            return out
        for key, val in after.items():
            if key.split("{")[0] == "sglang:spec_accept_length" and val > 0:
                out["accept_length"], out["source"] = val, "sglang-gauge"
            elif key.split("{")[0] == "sglang:spec_accept_rate" and val > 0:
                out["accept_rate"] = val
        return out

    def rules(self, model: str, role: str, flags: Mapping[str, FlagValue]) -> list[str]:
        problems: list[str] = []
        if role == "router":
            return problems
        if "model-path" in flags:
            problems.append(
                "set the model with the top-level 'model' key, not the 'model-path' flag"
            )
        if "disaggregation-mode" in flags:
            problems.append(
                "'disaggregation-mode' comes from the process role (prefill/decode); "
                "remove the flag"
            )
        algo = flags.get("speculative-algorithm")
        stray = [f for f in _SPEC_FLAGS if f in flags and flags[f] is not False]
        if stray and not algo:
            problems.append(f"{', '.join(stray)} set without 'speculative-algorithm'")
        steps, topk, draft = (flags.get(k) for k in _SPEC_FLAGS[:3])
        if (
            algo
            and topk == 1
            and isinstance(steps, int)
            and isinstance(draft, int)
            and draft != steps + 1
        ):
            problems.append(
                f"with speculative-eagle-topk 1, speculative-num-draft-tokens must be "
                f"speculative-num-steps + 1 = {steps + 1}, not {draft}"
            )
        return problems
