"""The vLLM adapter (and, beside it, the embedded engine's command line): the commands it
renders, and every port `vllm serve` binds with a fixed default is given per process, so two vLLM
processes (or arms) fit one node, and vLLM's own parser accepts the commands.

Before: only `--port` was allocated; every process kept vLLM 0.33.0's fixed
`--data-parallel-rpc-port` 29550, `--master-port` 29501 and `--data-parallel-supervisor-port`
9256 (engines/vllm.py says where each is bound). The real-parser test runs where vLLM
imports, named by SERVELAB_VLLM_PYTHON (tests/engines/test_flagcheck.py's docstring);
elsewhere the generated table judges.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from servelab import engines
from servelab.engines import flagcheck
from servelab.engines.base import ProcessConfig
from servelab.engines.launcher import Launcher
from servelab.engines.vllm import VLLM
from servelab.errors import UserError
from servelab.experiment.deploy.deployment import Deployment
from servelab.experiment.plan import processes
from servelab.experiment.plan.preflight import load

ROOT = Path(__file__).resolve().parents[2]


FIXED_DEFAULTS = {"--data-parallel-rpc-port": 29550, "--master-port": 29501,
                  "--data-parallel-supervisor-port": 9256}


PORT_FLAGS = ("--port", *FIXED_DEFAULTS)


def _ports(argv: list[str]) -> dict[str, int]:
    return {f: int(argv[argv.index(f) + 1]) for f in PORT_FLAGS if f in argv}


def _two_servers(tmp_path: Path, flags: dict | None = None) -> list:
    procs = [ProcessConfig(role="server", flags=dict(flags or {"max-num-seqs": 8}))
             for _ in range(2)]
    return Deployment(VLLM(), "m", procs, tmp_path).plan()


def test_two_vllm_processes_get_disjoint_ports(tmp_path):
    plans = _two_servers(tmp_path)
    got = [_ports(p.argv) for p in plans]
    for ports in got:
        assert set(ports) == set(PORT_FLAGS), ports        # every fixed-default port is given
    every = [v for ports in got for v in ports.values()]
    assert len(set(every)) == len(every) == 8, got          # all distinct on one node
    assert not set(every) & set(FIXED_DEFAULTS.values())


def test_a_port_the_file_sets_is_kept_and_not_given_to_another(tmp_path):
    plans = _two_servers(tmp_path, {"master-port": 29601})
    got = [_ports(p.argv) for p in plans]
    assert [g["--master-port"] for g in got] == [29601, 29601]   # the user's choice stands
    others = [v for g in got for f, v in g.items() if f != "--master-port"]
    assert 29601 not in others and len(set(others)) == len(others)


def test_both_arms_of_the_vllm_example_plan_accepted_commands_with_own_ports():
    spec = load(ROOT / "examples" / "vllm_mtp.toml")
    seen = []
    for arm in spec.arms:
        (cmd,) = processes.planned(spec, arm)
        assert cmd.verdict is not None and cmd.verdict.ok, (arm, cmd.verdict)
        ports = _ports(cmd.argv)
        assert set(ports) == set(PORT_FLAGS), (arm, cmd.argv)
        assert len(set(ports.values())) == 4 and not set(ports.values()) & set(
            FIXED_DEFAULTS.values())
        seen.append(cmd)
    assert len(seen) == 2


def test_vllms_own_parser_accepts_the_planned_commands(tmp_path):
    py = os.environ.get("SERVELAB_VLLM_PYTHON")
    if not py:
        pytest.skip("no interpreter with vllm: set SERVELAB_VLLM_PYTHON")
    eng = VLLM()
    for plan in _two_servers(tmp_path):
        prog = Launcher().argv(eng.entry("server"))
        args = plan.argv[len(prog) + (1 if prog[-1].endswith("cli.main") else 0):]
        assert args[0] == "m" and "--data-parallel-rpc-port" in args
        v = flagcheck.judge("vllm", "server", args, Launcher(python=py))
        assert "parser" in v.by and v.ok, (args, v)
        table = flagcheck.judge("vllm", "server", args, use_engine=False)
        assert table.ok and table.version == v.version


def test_vllm_and_embedded_commands():
    v = engines.get("vllm").command(
        ProcessConfig(role="server", flags={"max-num-seqs": 8}, port=8000), "m", {}
    )
    venv = Launcher(python="/opt/vllm/bin/python")
    v2 = engines.get("vllm").command(
        ProcessConfig(role="server", flags={}, port=8000, launcher=venv), "m", {})
    assert v2[:5] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.cli.main", "serve", "m"]
    assert v == [
        "vllm",
        "serve",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--max-num-seqs",
        "8",
    ]
    e = engines.get("embedded").command(
        ProcessConfig(role="server", flags={"device": "cpu"}, port=9), "tiny", {}
    )
    assert e[1:] == [
        "-m",
        "servelab",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "9",
        "--device",
        "cpu",
        "--config",
        "tiny",
    ]
    with pytest.raises(UserError, match="unknown engine 'tgi'"):
        engines.get("tgi")
