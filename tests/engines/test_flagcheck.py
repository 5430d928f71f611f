"""The engine's own parser judges what servelab plans: every example's every command passes it,
the generated tables agree with the parsers they came from, and the findings of issue 21
(ambiguous `--cuda-graph-max-bs`, flags vLLM rejects, deprecated recipes, one engine-info port
for every SGLang server) are refused or fixed.

servelab's venv has no engine. The tests that run the real parsers need an interpreter where
the engine imports, named by SERVELAB_SGLANG_PYTHON / SERVELAB_VLLM_PYTHON, e.g. (the wheel
unpacked and the few packages its parser module imports, scripts/gen_engine_flags.py):
  printf '#!/bin/sh\\nPYTHONPATH=/tmp/eng:/tmp/eng-deps exec python3 "$@"\\n' > /tmp/pysgl
  SERVELAB_SGLANG_PYTHON=/tmp/pysgl python -m pytest tests/engines/test_flagcheck.py
Without them the same commands are judged by the generated tables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servelab import engines
from servelab.engines import flagcheck, recipe
from servelab.engines.base import render_flags
from servelab.engines.launcher import Launcher
from servelab.errors import UserError
from servelab.experiment.plan import processes
from servelab.experiment.plan.preflight import load

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ENGINE_EXAMPLES = ("sglang_mtp", "vllm_mtp", "disagg", "disagg_ray")
PYTHONS = {"sglang": os.environ.get("SERVELAB_SGLANG_PYTHON"),
           "vllm": os.environ.get("SERVELAB_VLLM_PYTHON")}


def _real(engine: str) -> Launcher:
    py = PYTHONS[engine]
    if not py:
        pytest.skip(f"no interpreter with {engine}: set SERVELAB_{engine.upper()}_PYTHON "
                    "(this module's docstring)")
    return Launcher(python=py)


@pytest.mark.parametrize("name", ENGINE_EXAMPLES)
def test_every_planned_command_of_every_example_is_accepted(name):
    spec = load(EXAMPLES / f"{name}.toml")
    for arm in spec.arms:
        for cmd in processes.planned(spec, arm):
            assert cmd.verdict is not None and cmd.verdict.ok, (arm, cmd.role, cmd.verdict)
            assert "generated table" in cmd.verdict.by or "parser" in cmd.verdict.by


@pytest.mark.parametrize("name", ENGINE_EXAMPLES)
def test_the_real_parsers_accept_every_example_command(name):
    spec = load(EXAMPLES / f"{name}.toml")
    launcher = _real(spec.engine)
    eng = engines.get(spec.engine)
    for arm in spec.arms:
        for cfg, cmd in zip(processes.resolve(spec, arm), processes.planned(spec, arm),
                            strict=True):
            args = cmd.argv[len(cfg.launcher.argv(eng.entry(cfg.role))):]
            v = flagcheck.judge(spec.engine, cfg.role, args, launcher)
            assert "parser" in v.by and v.ok, (arm, cfg.role, v)


BAD = {  # what the examples and recipes held before, and what the engines say of it
    "sglang": [["--model-path", "m", "--cuda-graph-max-bs", "64"],
               ["--model-path", "m", "--cuda-graph-bs", "1", "2"],
               ["--model-path", "m", "--nsa-prefill-backend", "flashmla_sparse"],
               ["--model-path", "m", "--cuda-graph-backend-decode", "fast"],
               ["--model-path", "m", "--tp-size"]],
    "vllm": [["m", "--cuda-graph-sizes", "1", "2"], ["m", "--swap-space", "4"],
             ["m", "--enforce-eager", "yes"]],
}
GOOD = {
    "sglang": [["--model-path", "m", "--cuda-graph-max-bs-decode", "64", "--enable-metrics",
                "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1"],
               ["--model-path", "m", "--cuda-graph-backend-decode", "disabled",
                "--dsa-prefill-backend", "flashmla_sparse", "--speculative-num-step", "1"]],
    "vllm": [["m", "--cudagraph-capture-sizes", "1", "2", "--max-num-seqs", "8"],
             ["m", "--speculative-config", '{"method": "mtp"}', "--enforce-eager"]],
}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_tables_refuse_what_the_engines_refuse(engine):
    for args in BAD[engine]:
        v = flagcheck.judge(engine, "server", args, use_engine=False)
        assert not v.ok and v.version, args
    for args in GOOD[engine]:
        v = flagcheck.judge(engine, "server", args, use_engine=False)
        assert v.ok, (args, v.error)
    v = flagcheck.judge("sglang", "server", BAD["sglang"][0], use_engine=False)
    assert v.error == ("ambiguous option: --cuda-graph-max-bs could match "
                       "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_tables_agree_with_the_parser_they_came_from(engine):
    launcher = _real(engine)
    for args in BAD[engine] + GOOD[engine]:
        real = flagcheck.judge(engine, "server", args, launcher)
        table = flagcheck.judge(engine, "server", args, use_engine=False)
        assert "parser" in real.by and real.version == table.version
        assert real.ok == table.ok, (args, real.error, table.error)
        if not real.ok:        # the same first error (the table adds a spelling hint)
            assert table.error.startswith(real.error.split(" (did you mean")[0]), args


def test_each_table_records_its_engine_version_and_parser():
    for path in flagcheck.TABLE_DIR.glob("*.json"):
        t = json.loads(path.read_text())
        assert path.stem.endswith(t["version"]) and t["parser"] and len(t["options"]) > 50
        assert t["generated_by"] == "scripts/gen_engine_flags.py"


def test_recipes_use_no_flag_the_engines_deprecate_or_refuse():
    for r in recipe.all_recipes().values():
        for engine in ("sglang", "vllm"):
            if engine not in r.engines or not r.flags.get(engine):
                continue
            args = (["--model-path", "m"] if engine == "sglang" else ["m"])
            args += render_flags(r.flags_for(engine))
            v = flagcheck.judge(engine, "server", args, use_engine=False)
            assert v.ok, (r.name, v.error)
            table = flagcheck.load_table(flagcheck.tables(engine, "server")[v.version])
            used = [a for a in args if a.startswith("--")]
            assert not [a for a in used if table["options"][a]["deprecated"]], r.name


def test_unknown_version_names_what_exists():
    with pytest.raises(ValueError, match="no generated flag table for sglang 9.9.*have: 0.5.23"):
        flagcheck.judge("sglang", "server", ["--model-path", "m"], use_engine=False,
                        version="9.9")


def test_pd_processes_get_their_own_ports_and_the_router_the_bootstrap_port():
    spec = load(EXAMPLES / "disagg.toml")
    cmds = {c.role: c.argv for c in processes.planned(spec, "baseline")}

    def val(argv, flag):
        return int(argv[argv.index(flag) + 1])

    ports = [val(cmds[r], f) for r in ("prefill", "decode")
             for f in ("--port", "--nccl-port", "--engine-info-bootstrap-port")]
    boot = val(cmds["prefill"], "--disaggregation-bootstrap-port")
    assert len(set(ports + [boot])) == 7                    # all distinct on one node
    router = cmds["router"]
    assert router[router.index("--prefill") + 2] == str(boot)


def test_check_prints_each_command_env_and_verdict(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cli = [sys.executable, "-m", "servelab", "run", str(EXAMPLES / "sglang_mtp.toml"), "--check"]
    out = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "NCCL_PROTO=LL python3 -m sglang.launch_server --model-path" in out.stdout
    assert out.stdout.count("accepted by") == 2 and "--engine-info-bootstrap-port" in out.stdout
    js = subprocess.run([*cli, "--json"], capture_output=True, text=True, env=env, timeout=120)
    data = json.loads(js.stdout)
    mtp = data["arms"]["mtp"][0]
    assert mtp["argv"][:3] == ["python3", "-m", "sglang.launch_server"]
    assert "--speculative-algorithm" in mtp["argv"] and mtp["env"] == {"NCCL_PROTO": "LL"}
    assert mtp["verdict"]["ok"] and mtp["verdict"]["version"] == "0.5.23"


def test_a_refused_flag_is_one_line_naming_the_judge(tmp_path):
    f = tmp_path / "e.toml"
    f.write_text('name = "x"\nengine = "vllm"\nmodel = "m"\n[arms.a]\n[arms.b]\n'
                 'flags = { swap-space = 4 }\n[load]\nconcurrency = [1]\n')
    with pytest.raises(UserError, match=r"arms.b \(server\): unrecognized arguments: "
                       r"--swap-space 4.*judged by generated table vllm-server-0.33.0.json"):
        load(f)
