"""vLLM: `vllm serve MODEL`; `/health`, `/metrics` with `vllm:spec_decode_*` counters.

Speculative decoding is one JSON flag, `--speculative-config '{"method": "mtp",
"num_speculative_tokens": 1}'` (vllm/config/speculative.py: the per-model MTP names such as
`deepseek_mtp` are deprecated there and rewritten to `mtp` with a warning).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from servelab.engines.base import Engine, FlagValue, ProcessConfig, ProcessPlan, render_flags
from servelab.engines.launcher import Entry


class VLLM(Engine):
    """`vllm serve MODEL --host H --port P ...` (flags judged by vLLM's own `serve` parser, or
    the table generated from vLLM 0.33.0's)."""

    name = "vllm"
    roles = ("server",)
    parser = "vllm"
    info_path = "/version"
    conflicts = (("enforce-eager", "compilation-config"),)

    def entry(self, role: str) -> Entry:
        # `python -m vllm.entrypoints.cli.main serve` is what the `vllm` command runs
        return Entry(module="vllm.entrypoints.cli.main", console="vllm", subcommand=("serve",))

    def command(
        self, proc: ProcessConfig, model: str, peers: Mapping[str, ProcessPlan]
    ) -> list[str]:
        prog = proc.launcher.argv(self.entry(proc.role))
        if prog[-1] == "vllm.entrypoints.cli.main":          # run through the interpreter
            prog.append("serve")
        return prog + self.args(proc, model, peers)

    def args(
        self, proc: ProcessConfig, model: str, peers: Mapping[str, ProcessPlan]
    ) -> list[str]:
        return [model, "--host", proc.host, "--port", str(proc.port), *render_flags(proc.flags)]

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
