"""The embedded reference engine: `python -m servelab serve` (servelab.mini), the target on a
fresh machine. It serves `/health`, `/server_info` (and `/get_server_info`) and `/metrics` with
vLLM-named speculative-decoding counters.

Roles as SGLang's adapter: "server"; "prefill" and "decode" (`serve --disaggregation-mode
prefill|decode`, the prefill with its own `--disaggregation-bootstrap-port` per process, so
several arms share a node); "router" (`servelab router --pd-disaggregation --prefill URL BOOT
--decode URL`, sglang_router's flags). The pre-flight judges serve's flags with the same typed
model `servelab serve` parses them with (mini/server/args.py), a router's with the router's own
parser (mini/router/args.py): `run --check` refuses what the process would, with the same
message, and starts nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from servelab.engines.base import (
    Engine,
    FlagValue,
    ProcessConfig,
    ProcessPlan,
    pd_workers,
    render_flags,
)
from servelab.engines.launcher import Entry
from servelab.errors import UserError
from servelab.mini.router import args as router_args
from servelab.mini.server.args import ServeArgs

# host, port and the disaggregation mode come from the process itself (its role), not flags
_SET_BY_DEPLOYMENT = frozenset({"host", "port", "disaggregation-mode"})
_FLAGS = ServeArgs.field_flags() - _SET_BY_DEPLOYMENT
_ROUTER_FLAGS = frozenset({"policy", "request-timeout-secs", "log-level"})


class Embedded(Engine):
    """`python -m servelab serve --config <model> --host H --port P ...`; PD roles and the
    router as `python -m servelab router ...`."""

    name = "embedded"
    roles = ("server", "prefill", "decode", "router")
    known_flags = _FLAGS
    info_path = "/server_info"

    def info(self, url: str) -> dict[str, Any] | None:
        """`/server_info` (as SGLang), `/get_server_info` from builds that serve only that."""
        return super().info(url) or self._json(url, "/get_server_info")

    def entry(self, role: str) -> Entry:
        return Entry(module="servelab")

    def flags_for(self, role: str) -> frozenset[str]:
        return _ROUTER_FLAGS if role == "router" else _FLAGS

    def port_flags(self, role: str) -> tuple[str, ...]:
        return ("disaggregation-bootstrap-port",) if role == "prefill" else ()

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
        host_port = ["--host", proc.host, "--port", str(proc.port)]
        if proc.role == "router":
            argv = ["router", "--pd-disaggregation", *pd_workers(proc, peers)]
            return argv + host_port + render_flags(proc.flags)
        flags = dict(proc.flags)
        flags.setdefault("config", model)
        argv = ["serve", *host_port]
        if proc.role in ("prefill", "decode"):
            argv += ["--disaggregation-mode", proc.role]
        return argv + render_flags(flags)

    def rules(self, model: str, role: str, flags: Mapping[str, FlagValue]) -> list[str]:
        if role == "router":  # the router's own parser judges its flags (workers stand in)
            try:
                router_args.parse(["--pd-disaggregation", "--prefill", "http://127.0.0.1:1",
                                   "--decode", "http://127.0.0.1:2", *render_flags(flags)])
            except UserError as exc:
                return [str(exc)]
            return []
        problems = []
        if "disaggregation-mode" in flags:
            problems.append("'disaggregation-mode' comes from the process role (prefill/decode); "
                            "remove the flag")
        spec = [k for k in flags if k.startswith("speculative-") and k != "speculative-algorithm"]
        if spec and not flags.get("speculative-algorithm"):
            problems.append(f"{', '.join(spec)} set without 'speculative-algorithm'")
        if flags.get("cuda-graph") and not str(flags.get("device", "cpu")).startswith("cuda"):
            problems.append('cuda-graph needs device = "cuda"')
        if problems:
            return problems
        # the server's own typed model judges every value (bounds, choices, consistency)
        known = {k: v for k, v in flags.items() if k in _FLAGS}
        known.setdefault("config", model)
        # the real --port is allocated at launch, apart from every other port of the plan: a
        # stand-in that differs from the bootstrap port, so the two-ports rule cannot misfire
        known["port"] = 2 if str(known.get("disaggregation-bootstrap-port")) == "1" else 1
        mode = role if role in ("prefill", "decode") else "null"
        try:
            ServeArgs.from_flags({**known, "disaggregation-mode": mode})
        except UserError as exc:
            problems.append(str(exc))
        return problems
