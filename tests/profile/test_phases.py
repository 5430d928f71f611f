"""Phase names, the warm-up rule (median/MAD per phase, capture/compile calls) and the mix."""

from __future__ import annotations

import json
import statistics

import pytest

from servelab.errors import UserError
from servelab.profile.analyze import analyze
from servelab.profile.headline import mix_from_load_point
from servelab.profile.phases import MAD_K, MIN_RATIO, parse_mix, role_of
from servelab.profile.steps import find_steps, parse_step_name
from servelab.profile.synth import SynthKernel, write_trace
from servelab.profile.trace import read_trace


@pytest.mark.parametrize("name, want", [
    ("step[DECODE bs=16]", ("DECODE", 16)),
    ("step[EXTEND bs=3 tokens=900]", ("EXTEND", 3)),
    ("step[TARGET_VERIFY bs=8]", ("TARGET_VERIFY", 8)),
    ("step[DRAFT_EXTEND_V2 bs=8]", ("DRAFT_EXTEND_V2", 8)),
    ("step[IDLE]", ("IDLE", None)),
    ("step[EXTEND bs=1 toks=1025 c_sqsq=1050625 c_sqsk=1050625 c_sk=1025]", ("EXTEND", 1)),
    ("step[MIXED bs=66 c=2 g=64 c_sq=2048 c_sk=2048]", ("MIXED", 66)),
    ("step[decode bs=16]", ("DECODE", 16)),  # SGLang's first spans (PR 23419): lower case
    ("step[prefill bs=2 toks=300]", ("PREFILL", 2)),
    ("step[mixed bs=5 ext=300 dec=4]", ("MIXED", 5)),
    ("step[idle]", ("IDLE", None)),
    ("execute_context_0(0)_generation_32(32)", ("DECODE", 32)),
    ("execute_context_2(4096)_generation_0(0)", ("PREFILL", 2)),
    ("execute_context_1(512)_generation_30(30)", ("MIXED", 31)),
    ("ProfilerStep#3", (None, None)),
])
def test_engine_step_names(name, want):
    assert parse_step_name(name) == want


def test_roles():
    assert [role_of(p) for p in ("DECODE", "EXTEND", "PREFILL", "TARGET_VERIFY",
                                 "DRAFT_EXTEND", "MIXED", "STEP", "WEIRD")] == [
        "decode", "prefill", "prefill", "verify", "draft", "mixed", "step", "other"]


def _steps_of(tmp_path, walls: list[float], name: str = "step[DECODE bs=4]"):
    p = tmp_path / "t.json"
    write_trace(p, [[SynthKernel("gemm_kernel", w - 6.0)] for w in walls], step_name=name)
    return p


def test_a_slow_outlier_is_warm_up_by_median_and_mad(tmp_path):
    """Walls 100 +- 2 us, one 250 us (2.5x the median: warm-up), one 180 us (1.8x: beyond 5
    MADs but under MIN_RATIO x median, so kept: a slow step is not a compile)."""
    walls = [100.0, 102.0, 98.0, 101.0, 99.0, 100.0, 250.0, 180.0]
    rep = analyze(_steps_of(tmp_path, walls))
    got = [st["wall_us"] for st in rep["steps"]]  # the synthetic walls, as the trace holds them
    med = statistics.median(got)
    mad = statistics.median(abs(w - med) for w in got)
    limit = max(med + MAD_K * 1.4826 * mad, MIN_RATIO * med)
    assert [w["index"] for w in rep["warmup_steps"]] == [
        i for i, w in enumerate(got) if w > limit] == [6]
    assert rep["warmup_steps"][0]["reason"].startswith("2.5x the DECODE median step")
    dec = rep["phases"]["DECODE"]
    assert dec["n_steps"] == 7 and dec["n_warmup"] == 1
    assert dec["wall_us"] == pytest.approx(sum(got) - got[6])
    assert rep["wall_us"] == pytest.approx(sum(got))  # all steps: the secondary view keeps it


def test_identical_steps_lose_none(tmp_path):
    rep = analyze(_steps_of(tmp_path, [100.0] * 6))
    assert rep["warmup_steps"] == [] and rep["phases"]["DECODE"]["n_steps"] == 6


def test_a_capture_call_names_a_step_even_in_a_short_phase(tmp_path):
    """Two EXTEND steps cannot be screened by distribution; the one that instantiated a CUDA
    graph is warm-up all the same (read from the runtime call, whatever its length)."""
    p = _steps_of(tmp_path, [100.0, 101.0], name="step[EXTEND bs=2]")
    doc = json.loads(p.read_text())
    second = [e for e in doc["traceEvents"] if e.get("cat") == "user_annotation"][1]
    doc["traceEvents"].append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphInstantiate",
                               "ts": second["ts"] + 2.0, "dur": 1.0, "args": {"correlation": 7}})
    p.write_text(json.dumps(doc))
    t = read_trace(p)
    assert [c[0] for c in t.warmup_calls] == ["cudaGraphInstantiate"]
    assert len(find_steps(t).steps) == 2
    rep = analyze(p)
    (w,) = rep["warmup_steps"]
    assert w["index"] == 1 and w["reason"] == "CUDA-graph capture (cudaGraphInstantiate x1)"
    assert "too few to screen" in rep["phases"]["EXTEND"]["screening"]


def test_every_step_warm_up_leaves_no_steady_figures(tmp_path):
    p = _steps_of(tmp_path, [100.0], name="step[DECODE bs=1]")
    doc = json.loads(p.read_text())
    ann = next(e for e in doc["traceEvents"] if e.get("cat") == "user_annotation")
    doc["traceEvents"].append({"ph": "X", "cat": "cuda_driver", "name": "cuModuleLoadData",
                               "ts": ann["ts"] + 1.0, "dur": 1.0, "args": {"correlation": 9}})
    p.write_text(json.dumps(doc))
    rep = analyze(p, whatifs=["gemm=free"])
    assert rep["phases"]["DECODE"]["n_steps"] == 0
    assert rep["phases"]["DECODE"]["verdict"].startswith("all 1 steps are warm-up")
    assert rep["verdict"].startswith("No decode/verify/draft/mixed steps in this trace")


def test_parse_mix():
    assert parse_mix("decode=0.9,extend=0.1") == pytest.approx({"DECODE": 0.9, "EXTEND": 0.1})
    assert parse_mix("decode=9, prefill=1") == pytest.approx({"DECODE": 0.9, "PREFILL": 0.1})
    for bad in ("decode", "decode=x", "decode=-1", "decode=0", ""):
        with pytest.raises(UserError, match="--mix"):
            parse_mix(bad)


def test_mix_from_a_load_point_by_hand():
    """TTFT 100 ms, TPOT 10 ms, 200 tokens per request: decode 199 x 10 = 1,990 ms of 2,090."""
    s = {"ttft_ms": {"mean": 100.0}, "tpot_ms": {"mean": 10.0}, "completed": 10,
         "total_output_tokens": 2000}
    assert mix_from_load_point(s, 7) == pytest.approx({"PREFILL": 100 / 2090,
                                                       "DECODE": 1990 / 2090})
    with pytest.raises(UserError, match="load point 7 has no TTFT"):
        mix_from_load_point({"ttft_ms": {"mean": None}}, 7)
