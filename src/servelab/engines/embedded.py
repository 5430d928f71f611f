"""The embedded reference engine: `python -m servelab serve` (servelab.mini), the target on a
fresh machine. It serves `/health`, `/get_server_info` and `/metrics` with vLLM-named
speculative-decoding counters."""

from __future__ import annotations

import sys
from collections.abc import Mapping

from servelab.engines.base import Engine, FlagValue, ProcessConfig, ProcessPlan, render_flags

_FLAGS = frozenset("""
config device max-running-requests cuda-graph attention-backend seed
speculative-algorithm speculative-num-steps speculative-eagle-topk speculative-num-draft-tokens
""".split())


class Embedded(Engine):
    """`python -m servelab serve --config <model> --host H --port P ...`."""

    name = "embedded"
    roles = ("server",)
    known_flags = _FLAGS
    info_path = "/get_server_info"

    def command(self, proc: ProcessConfig, model: str, peers: Mapping[str, ProcessPlan]) -> list[str]:
        flags = dict(proc.flags)
        flags.setdefault("config", model)
        return [sys.executable, "-m", "servelab", "serve", "--host", proc.host,
                "--port", str(proc.port), *render_flags(flags)]

    def rules(self, model: str, role: str, flags: Mapping[str, FlagValue]) -> list[str]:
        spec = [k for k in flags if k.startswith("speculative-") and k != "speculative-algorithm"]
        if spec and not flags.get("speculative-algorithm"):
            return [f"{', '.join(spec)} set without 'speculative-algorithm'"]
        return []
