"""Engine config files: names, contents and merges, and every key the engines ship read and
written back."""

from __future__ import annotations

import json

import pytest
from fp8_engines import BASE, H200, need_engine_dir

from servelab.kernels.fp8_gemm import formats as F
from servelab.tune.space import Config

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


# entries as the engines ship them (SGLang's sm90 keys, vLLM's ROCm entries without
# num_stages); servelab's reader rejected all of these before
SHIPPED_STYLE = {
    "1": {**BASE, "num_stages": 4, "SPLIT_K": 4, "SWAP_AB": True},
    "8": {**BASE, "num_stages": 2, "waves_per_eu": 0},
    "64": {**BASE, "kpack": 1, "matrix_instr_nonkdim": 16},
}


def test_every_key_the_engines_ship_is_read_and_written_back(tmp_path):
    p = tmp_path / F.config_file_name("sglang", 7168, 18432, H200)
    p.write_text(json.dumps(SHIPPED_STYLE))
    entries = F.read_config_file(p)
    assert entries[1]["SPLIT_K"] == 4 and entries[1]["SWAP_AB"] is True
    assert "num_stages" not in entries[64] and entries[64]["kpack"] == 1
    assert F.read_config_file(p) == {int(k): v for k, v in SHIPPED_STYLE.items()}
    for m, e in entries.items():                 # through the tuner's Config and back
        assert Config.from_engine(e).as_engine() == e, m
    assert Config.from_engine(entries[64]).stages == 3    # Triton's default where none
    out = tmp_path / "merged.json"
    F.merge_write_config(out, entries)
    assert json.loads(out.read_text()) == SHIPPED_STYLE
    with pytest.raises(ValueError, match="unknown keys \\['BLOCK_M'\\].*known: BLOCK_SIZE_M"):
        F.validate_entry({**BASE, "BLOCK_M": 16}, "x")
    with pytest.raises(ValueError, match="SWAP_AB=1 is not true/false"):
        F.validate_entry({**BASE, "SWAP_AB": 1}, "x")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_shipped_block_fp8_file_is_read(engine):
    folder = need_engine_dir(engine)
    files = [p for p in folder.iterdir() if (n := F.parse_file_name(p.name)) and n.fmt == engine]
    assert len(files) > 100                        # 137 (SGLang 0.5.23), 244 (vLLM 0.33.0)
    bad = []
    for p in files:
        try:
            F.read_config_file(p)
        except ValueError as exc:
            bad.append(str(exc))
    assert not bad, f"{len(bad)} of {len(files)} unreadable, first: {bad[:1]}"
