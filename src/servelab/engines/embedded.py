"""The embedded reference engine: `python -m servelab serve` (servelab.mini), the target on a
fresh machine. It serves `/health`, `/server_info` (and `/get_server_info`) and `/metrics` with vLLM-named
speculative-decoding counters."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from servelab.engines.base import Engine, FlagValue, ProcessConfig, ProcessPlan, render_flags
from servelab.engines.launcher import Entry

_FLAGS = frozenset(
    """
config weights random-weights device max-running-requests context-length cuda-graph
attention-backend seed num-threads served-model-name log-level speculative-algorithm
speculative-num-steps speculative-eagle-topk speculative-num-draft-tokens
""".split()
)


class Embedded(Engine):
    """`python -m servelab serve --config <model> --host H --port P ...`."""

    name = "embedded"
    roles = ("server",)
    known_flags = _FLAGS
    info_path = "/server_info"

    def info(self, url: str) -> dict[str, Any] | None:
        """`/server_info` (as SGLang), `/get_server_info` from builds that serve only that."""
        return super().info(url) or self._json(url, "/get_server_info")

    def entry(self, role: str) -> Entry:
        return Entry(module="servelab")

    def command(
        self, proc: ProcessConfig, model: str, peers: Mapping[str, ProcessPlan]
    ) -> list[str]:
        """servelab's own engine: this interpreter unless the file names another."""
        launcher = proc.launcher if proc.launcher.python else replace(
            proc.launcher, python=sys.executable)
        return launcher.argv(self.entry(proc.role)) + self.args(proc, model, peers)

    def args(
        self, proc: ProcessConfig, model: str, peers: Mapping[str, ProcessPlan]
    ) -> list[str]:
        flags = dict(proc.flags)
        flags.setdefault("config", model)
        return [
            "serve",
            "--host",
            proc.host,
            "--port",
            str(proc.port),
            *render_flags(flags),
        ]

    def rules(self, model: str, role: str, flags: Mapping[str, FlagValue]) -> list[str]:
        problems = []
        spec = [k for k in flags if k.startswith("speculative-") and k != "speculative-algorithm"]
        if spec and not flags.get("speculative-algorithm"):
            problems.append(f"{', '.join(spec)} set without 'speculative-algorithm'")
        if flags.get("speculative-algorithm") and flags.get("speculative-eagle-topk", 1) != 1:
            problems.append("the embedded engine drafts a chain: speculative-eagle-topk must be 1")
        if flags.get("cuda-graph") and flags.get("device", "cpu") != "cuda":
            problems.append('cuda-graph needs device = "cuda"')
        return problems
