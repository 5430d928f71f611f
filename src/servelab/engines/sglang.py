"""SGLang: `python -m sglang.launch_server`, and `sglang_router` for prefill/decode disaggregation.

Flags are judged by SGLang's own parser (ServerArgs.add_cli_args; the router's RouterArgs),
run in the engine's interpreter, or by the tables generated from it (engines/flagcheck.py;
SGLang 0.5.23, sglang-router 0.3.2). Every server binds, besides its HTTP port, an NCCL port
(`--nccl-port`) and an engine-info bootstrap port (`--engine-info-bootstrap-port`, default
6789 in 0.5.23), and a prefill server its disaggregation bootstrap port: each process gets its
own (port_flags), so prefill and decode, or several arms, share one node. The server describes
itself at `/server_info` (`/get_server_info` before it); acceptance over a window comes from the
`sglang:spec_accept_length` gauge (with --enable-metrics).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servelab.engines.base import (
    Engine,
    FlagValue,
    ProcessConfig,
    ProcessPlan,
    pd_workers,
    render_flags,
    spec_window,
)
from servelab.engines.launcher import Entry

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
    parser = "sglang"
    # current SGLang serves /server_info and logs a deprecation warning for /get_server_info
    # (python/sglang/srt/entrypoints/http_server.py); older versions have only the latter
    info_path = "/server_info"
    conflicts = (
        ("disable-cuda-graph", "cuda-graph-backend-decode"),
        ("disable-cuda-graph", "cuda-graph-max-bs-decode"),
    )

    def info(self, url: str) -> dict[str, Any] | None:
        """`/server_info`, or `/get_server_info` on SGLang versions without it."""
        return super().info(url) or self._json(url, "/get_server_info")

    def entry(self, role: str) -> Entry:
        if role == "router":
            return Entry(module="sglang_router.launch_router")
        return Entry(module="sglang.launch_server")

    def port_flags(self, role: str) -> tuple[str, ...]:
        if role == "router":
            return ()
        own = ("nccl-port", "engine-info-bootstrap-port")
        return (*own, "disaggregation-bootstrap-port") if role == "prefill" else own

    def args(
        self, proc: ProcessConfig, model: str, peers: Mapping[str, ProcessPlan]
    ) -> list[str]:
        host_port = ["--host", proc.host, "--port", str(proc.port)]
        if proc.role == "router":
            argv = ["--pd-disaggregation", *pd_workers(proc, peers)]
            return argv + host_port + render_flags(proc.flags)
        argv = ["--model-path", model, *host_port]
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
