"""Pre-flight (experiment/plan/preflight.py): every check that can fail without launching
anything refuses in one line naming the arm; recipes resolve per engine (plan/processes.py);
the shipped examples pass."""

from __future__ import annotations

import pytest
from experiment_files import BASE, EXAMPLES, error_of, load_text

from servelab.experiment.plan import processes
from servelab.experiment.plan.preflight import load


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
    msg = error_of(tmp_path, BASE.format(engine=engine, model=model, arm_b=arm_b))
    assert want in msg and "arms.b" in msg


def test_recipe_applies_per_engine(tmp_path):
    s = load_text(
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
    v = load_text(
        tmp_path,
        BASE.format(engine="vllm", model="m", arm_b='recipe = ["mtp-conservative", "nccl-ll"]'),
    )
    (proc,) = processes.resolve(v, "b")
    assert '"method": "mtp"' in proc.flags["speculative-config"] and proc.env["NCCL_PROTO"] == "LL"


def test_examples_pass_preflight():
    mine = ("demo", "sglang_mtp", "vllm_mtp", "disagg", "aa_noise")
    for name in mine:
        load(EXAMPLES / f"{name}.toml")


PD = """
name = "pd"
engine = "embedded"
model = "tiny"
[base.flags]
device = "cpu"
[[base.processes]]
role = "prefill"
{prefill}
[[base.processes]]
role = "decode"
{decode}
[[base.processes]]
role = "router"
[arms.a]
[arms.b]
{arm_b}
[load]
concurrency = [1]
"""


@pytest.mark.parametrize(("prefill", "decode", "arm_b", "want"), [
    # before: --check passed these; the runs failed after launch (a 502, or 4 x 60 s timeouts)
    ("", "", 'recipe = "mtp-conservative"\nroles = ["decode"]',
     "arms.b: speculative flags on the decode process only"),
    ("port = 31000", "port = 31000", "", "process 2 (decode) port 31000 is also process 1 (prefill) port"),
    ("flags = { disaggregation-bootstrap-port = 31001 }", "port = 31001", "",
     "is also process 1 (prefill) disaggregation-bootstrap-port"),
])
def test_pd_deployments_that_cannot_work_are_refused_at_check(tmp_path, prefill, decode, arm_b, want):
    assert want in error_of(tmp_path, PD.format(prefill=prefill, decode=decode, arm_b=arm_b))


def test_mtp_on_both_pd_roles_passes(tmp_path):
    text = PD.format(prefill="", decode="", arm_b='recipe = "mtp-conservative"')
    assert load_text(tmp_path, text).name == "pd"
