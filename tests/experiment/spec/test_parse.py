"""Experiment files: one-line errors naming the key, pre-flight checks, and the schedule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servelab.errors import UserError
from servelab.experiment import processes
from servelab.experiment import spec as spec_mod
from servelab.experiment.schedule import plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

BASE = """
name = "x"
engine = "{engine}"
model = "{model}"
[arms.a]
[arms.b]
{arm_b}
[load]
concurrency = [1, 8]
"""


def _load(tmp_path, text):
    f = tmp_path / "e.toml"
    f.write_text(text)
    return spec_mod.load(f)


def _err(tmp_path, text) -> str:
    with pytest.raises(UserError) as ei:
        _load(tmp_path, text)
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            "repetitions = 0\n" + BASE.format(engine="sglang", model="m", arm_b=""),
            "e.toml: repetitions: Input should be greater than or equal to 1",
        ),
        (
            BASE.format(engine="sglang", model="m", arm_b="") + "repetitions = 3\n",
            "load.repetitions: unknown key",
        ),
        (
            BASE.format(engine="sglang", model="m", arm_b="flags = { tp-size = 2 }\ncolour = 1"),
            "arms.b.colour: unknown key",
        ),
        (BASE.format(engine="tgi", model="m", arm_b=""), "engine: unknown engine 'tgi'"),
        (
            BASE.format(engine="sglang", model="m", arm_b="").replace(
                "concurrency = [1, 8]", "concurrency = [0]"
            ),
            "load.concurrency: concurrency values must be >= 1",
        ),
        (
            BASE.format(engine="sglang", model="m", arm_b="").replace("[arms.b]\n", ""),
            "arms: an experiment needs at least two arms",
        ),
        ('name = "x"\nengine = "sglang"\n[load\n', "invalid TOML"),
        (
            BASE.format(engine="sglang", model="m", arm_b="").replace('"x"', '"my exp"'),
            "e.toml: name: 'my exp' must be letters, digits, '-', '_' or '.'",
        ),
        (  # a table where a flag value belongs: one problem at the flag, not one per union type
            BASE.format(engine="sglang", model="m", arm_b="flags = { tp-size = [1, { a = 1 }] }"),
            "arms.b.flags.tp-size: must be a string, a number, true/false, or a list",
        ),
        (  # a delta for a process the deployment does not have would silently change nothing
            BASE.format(engine="sglang", model="m", arm_b='roles = ["decode"]\nflags = { ep = 2 }'),
            "arms.b.roles: no 'decode' process in this deployment (its processes: server)",
        ),
        (
            BASE.format(engine="sglang", model="m", arm_b="")
            + '[workload]\ndataset = "no/such.json"\n',
            "workload: --dataset no/such.json: no such file",
        ),
    ],
)
def test_bad_file_gives_one_line_naming_the_key(tmp_path, text, want):
    assert want in _err(tmp_path, text)


@pytest.mark.parametrize(
    ("engine", "model", "arm_b", "want"),
    [
        (
            "sglang",
            "m",
            "flags = { speculative-num-stepz = 1 }",
            "unrecognized arguments: --speculative-num-stepz 1 (did you mean "
            "--speculative-num-steps?) [judged by generated table sglang-server-0.5.23.json",
        ),
        (
            "sglang",
            "m",
            "flags = { disable-cuda-graph = true, cuda-graph-max-bs-decode = 16 }",
            "'disable-cuda-graph' and 'cuda-graph-max-bs-decode' conflict",
        ),
        (
            "sglang",
            "m",
            "flags = { speculative-algorithm = 'EAGLE', speculative-num-steps = 3, "
            "speculative-eagle-topk = 1, speculative-num-draft-tokens = 2 }",
            "speculative-num-draft-tokens must be speculative-num-steps + 1 = 4",
        ),
        (
            "sglang",
            "deepseek-ai/DeepSeek-V4-Flash",
            "flags = { speculative-algorithm = 'EAGLE', "
            "speculative-num-steps = 1, speculative-eagle-topk = 2, "
            "speculative-num-draft-tokens = 4 }",
            "DeepSeek-V4 MTP (NextN) needs speculative-algorithm EAGLE with "
            "speculative-eagle-topk 1",
        ),
        (
            "vllm",
            "m",
            "flags = { enforce-eager = true, compilation-config = '{}' }",
            "'enforce-eager' and 'compilation-config' conflict",
        ),
        (
            "vllm",
            "m",
            "flags = { speculative-config = 'not json' }",
            "speculative-config is not JSON",
        ),
        ("sglang", "m", 'recipe = "no-such"', "unknown recipe 'no-such'"),
        ("embedded", "tiny", "flags = { cuda-graph = true }", "cuda-graph needs device"),
    ],
)
def test_preflight_refuses_before_any_launch(tmp_path, engine, model, arm_b, want):
    msg = _err(tmp_path, BASE.format(engine=engine, model=model, arm_b=arm_b))
    assert want in msg and "arms.b" in msg


def test_recipe_applies_per_engine(tmp_path):
    s = _load(
        tmp_path,
        BASE.format(
            engine="sglang",
            model="deepseek-ai/DeepSeek-V4-Flash",
            arm_b='recipe = "mtp-conservative"',
        ),
    )
    (proc,) = processes.resolve(s, "b")
    assert proc.flags == {
        "speculative-algorithm": "EAGLE",
        "speculative-num-steps": 1,
        "speculative-eagle-topk": 1,
        "speculative-num-draft-tokens": 2,
    }
    v = _load(
        tmp_path,
        BASE.format(engine="vllm", model="m", arm_b='recipe = ["mtp-conservative", "nccl-ll"]'),
    )
    (proc,) = processes.resolve(v, "b")
    assert '"method": "mtp"' in proc.flags["speculative-config"] and proc.env["NCCL_PROTO"] == "LL"


def test_cli_prints_one_line_and_exits_2(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text(
        BASE.format(
            engine="sglang", model="m", arm_b="flags = { tp-size = 'two' }\nremove = ['dp-size']"
        )
    )
    p = subprocess.run(
        [sys.executable, "-m", "servelab", "run", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "arms.b.remove" in lines[0], (
        p.stderr
    )


def _spec(order, reps=3, restart="run", seed=0):
    return spec_mod.parse(
        {
            "name": "s",
            "engine": "sglang",
            "model": "m",
            "baseline": "B",
            "arms": {"A": {}, "B": {}},
            "load": {"concurrency": [1, 16]},
            "repetitions": reps,
            "order": order,
            "restart": restart,
            "seed": seed,
        }
    )


def test_schedule_interleaved_abba_baseline_first():
    runs = plan(_spec("interleaved", reps=4))
    arms = [r.arm for r in runs if r.load_key == "c=1"]
    assert arms == ["B", "A", "A", "B", "B", "A", "A", "B"]
    assert [r.block for r in runs if r.load_key == "c=1"] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert len({r.group for r in runs}) == len(runs)  # fresh deployment per run
    per_arm = plan(_spec("interleaved", restart="arm"))
    assert len({r.group for r in per_arm}) == 6 and len(per_arm) == 12


def test_schedule_shuffled_is_seeded_and_sequential_unpaired():
    a, b = plan(_spec("shuffled", reps=8, seed=1)), plan(_spec("shuffled", reps=8, seed=1))
    assert [r.arm for r in a] == [r.arm for r in b]
    orders = {tuple(r.arm for r in a if r.block == k and r.load_key == "c=1") for k in range(8)}
    assert orders == {("A", "B"), ("B", "A")}  # both orders occur, pairs kept
    seq = plan(_spec("sequential"))
    assert [r.arm for r in seq] == ["B"] * 6 + ["A"] * 6 and all(r.block is None for r in seq)
    assert sorted({(r.arm, r.load_key, r.repetition) for r in seq}) == sorted(
        (arm, lk, rep) for arm in "AB" for lk in ("c=1", "c=16") for rep in range(3)
    )


def test_examples_pass_preflight():
    mine = ("demo", "sglang_mtp", "vllm_mtp", "disagg", "aa_noise")
    for name in mine:
        spec_mod.load(EXAMPLES / f"{name}.toml")


def test_the_documented_full_example_is_valid(tmp_path):
    doc = (Path(__file__).resolve().parents[2] / "docs" / "EXPERIMENTS.md").read_text()
    block = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    text = "\n".join(
        line for line in block.splitlines() if not line.startswith(("dataset =", "tokenizer ="))
    )
    s = _load(tmp_path, text)
    (proc,) = processes.resolve(s, "mtp")
    assert proc.flags["speculative-num-draft-tokens"] == 2 and "cuda-graph-max-bs" not in proc.flags
    assert proc.flags["mem-fraction-static"] == 0.8 and proc.env["NCCL_PROTO"] == "LL"
