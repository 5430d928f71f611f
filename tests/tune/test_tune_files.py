"""Engine config files (names, contents, merges) and the JSONL checkpoint."""

from __future__ import annotations

import json

import pytest

from servelab.kernels.fp8_gemm import formats as F
from servelab.tune import checkpoint as CK

E = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
     "num_warps": 4, "num_stages": 3}


def test_file_names_are_the_engines():
    # SGLang fp8_kernel.py: block_shape=[{block_n}, {block_k}] (a space); vLLM: no space
    assert (F.config_file_name("sglang", 4096, 512, "NVIDIA H200")
            == "N=4096,K=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json")
    assert (F.config_file_name("vllm", 4096, 512, "NVIDIA H100 80GB HBM3")
            == "N=4096,K=512,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json")
    for fmt in F.FORMATS:
        p = F.parse_file_name(F.config_file_name(fmt, 7168, 18432, "NVIDIA H200"))
        assert (p.fmt, p.n, p.k, p.device, p.block) == (fmt, 7168, 18432, "NVIDIA_H200", (128, 128))
    assert F.parse_file_name("tune-checkpoint.jsonl") is None
    with pytest.raises(ValueError, match="unknown format"):
        F.config_file_name("trt", 1, 1, "x")


def test_contents_and_merge_never_lose_batch_sizes(tmp_path):
    p = tmp_path / F.config_file_name("sglang", 1024, 4096, "NVIDIA H200")
    F.merge_write_config(p, {16: E, 1: E})
    F.merge_write_config(p, {4096: dict(E, BLOCK_SIZE_M=128)})
    F.merge_write_config(p, {16: dict(E, num_warps=8)})               # an update replaces one M
    raw = json.loads(p.read_text())
    assert list(raw) == ["1", "16", "4096"]                           # ascending, keys are strings
    assert raw["16"]["num_warps"] == 8 and raw["4096"]["BLOCK_SIZE_M"] == 128
    assert list(raw["1"]) == list(F.CONFIG_KEYS)
    assert not list(tmp_path.glob(".*.tmp"))                          # atomic: no temp file left


def test_malformed_file_is_an_error_not_overwritten(tmp_path):
    p = tmp_path / "f.json"
    p.write_text('{"1": {"BLOCK_SIZE_M": 64}}')
    with pytest.raises(ValueError, match="missing keys"):
        F.merge_write_config(p, {2: E})
    assert p.read_text() == '{"1": {"BLOCK_SIZE_M": 64}}'
    p.write_text('{"x": {}}')
    with pytest.raises(ValueError, match="not a batch size"):
        F.read_config_file(p)


def test_checkpoint_keeps_highest_reps_filters_context_and_survives_a_torn_line(tmp_path):
    ck = CK.Checkpoint(tmp_path / CK.FILE_NAME)
    rec = {"t": "m", "ctx": "a", "n": 1, "k": 2, "m": 3, "cfg_key": "x", "cfg": E, "us": 5.0, "reps": 3}
    ck.append(rec)
    ck.append(dict(rec, us=4.0, reps=7))
    ck.append(dict(rec, ctx="b", us=1.0, reps=9))                   # another device/method
    ck.append({"t": "unit", "ctx": "a", "search": "fast", "n": 1, "k": 2, "m": 3, "best": E})
    ck.close()
    with open(ck.path, "ab") as f:
        f.write(b'{"t": "m", "ctx": "a", "n": 1, "k"')                # killed mid-write
    ck2 = CK.Checkpoint(ck.path)
    ck2.append({"t": "unit", "ctx": "a", "search": "fast", "n": 1, "k": 2, "m": 4, "best": E})
    ck2.close()
    st = CK.Checkpoint(ck.path).load("a", "fast")
    assert st.torn_lines == 1
    assert st.measurements[(1, 2, 3)]["x"]["us"] == 4.0
    assert set(st.units) == {(1, 2, 3), (1, 2, 4)}
    assert CK.Checkpoint(ck.path).load("a", "exhaustive").units == {}
    assert CK.context_id(a=1, b=2) == CK.context_id(b=2, a=1) != CK.context_id(a=1, b=3)
