"""vLLM: `vllm serve MODEL`; `/health`, `/metrics` with `vllm:spec_decode_*` counters.

Speculative decoding is one JSON flag, `--speculative-config '{"method": "mtp",
"num_speculative_tokens": 1}'` (vllm/config/speculative.py: the per-model MTP names such as
`deepseek_mtp` are deprecated there and rewritten to `mtp` with a warning).

Ports a `vllm serve` process binds besides `--port`, as vLLM 0.33.0's source has them, and what
servelab does so several processes (arms, replicas) share one node:
  --data-parallel-rpc-port  fixed default 29550 (config/parallel.py): the engines' ZMQ
      handshake when data parallelism is not all on this node (v1/engine/utils.py);
  --master-port             fixed default 29501: torch.distributed's rendezvous with
      --nnodes > 1 (distributed/parallel_state.py);
  --data-parallel-supervisor-port  fixed default 9256: the supervisor's HTTP server under
      --data-parallel-multi-port-external-lb (entrypoints/launchers/dp_supervisor.py).
  Each gets a free port per process (port_flags) unless the experiment sets it: with the fixed
  defaults, two processes that use them collide.
Asked from the OS at run time (port 0, distinct per process), so left alone: the
torch.distributed TCP store of multi-GPU workers and the data-parallel master ports
(`get_open_port`, `get_open_ports_list`), unless VLLM_PORT is set, when vLLM scans upward
from it: a VLLM_PORT shared by processes makes them race for the same ports, so set it per
arm (`[arms.X.env]`) or not at all. The engine core and its workers talk over ZMQ IPC
sockets in VLLM_RPC_BASE_PATH (a temp dir), not TCP, on one node.
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

    def port_flags(self, role: str) -> tuple[str, ...]:
        """The ports with a fixed default (module docstring), each process its own."""
        return ("data-parallel-rpc-port", "master-port", "data-parallel-supervisor-port")

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
