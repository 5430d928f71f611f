"""`tune verify`'s bad input: a one-line error naming the option, before any timing. Before:
`--device gpu` and `--engine foo` ended as "internal error" (torch's and formats' exceptions),
and a `--shipped` folder that does not exist was silently taken as "the engine ships nothing",
so the table labelled the default's timing as the shipped one. And a tuned config that does not
launch makes `tune verify` exit 1, naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from fp8_engines import BASE

from servelab.errors import UserError
from servelab.kernels.fp8_gemm import formats
from servelab.tune import verify as V

TUNED = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
         "num_warps": 4, "num_stages": 2}


def _tuned_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tuned"
    d.mkdir()
    formats.merge_write_config(
        d / formats.config_file_name("sglang", 128, 256, "Triton_interpreter_CPU"), {1: TUNED})
    return d


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"device": "gpu"}, r"--device gpu: choose cuda or cpu"),
    ({"device": "cpu", "engine": "foo"}, r"--engine foo: choose one of sglang, vllm"),
    ({"device": "cpu", "shipped_dir": "missing"}, r"--shipped .*missing: not a folder"),
])
def test_bad_options_are_named_before_timing(tmp_path, kwargs, match):
    if "shipped_dir" in kwargs:
        kwargs = {**kwargs, "shipped_dir": tmp_path / kwargs["shipped_dir"]}
    with pytest.raises(UserError, match=match):
        V.verify(_tuned_dir(tmp_path), kernel="servelab", **kwargs)


def test_verify_exits_nonzero_when_a_tuned_config_fails(tmp_path):
    import os
    import subprocess
    import sys
    ok = {**BASE, "BLOCK_SIZE_N": 32, "num_stages": 2}
    # within the engines' limits, but 4 splits of K=256's two scale groups cannot launch
    bad = {**BASE, "BLOCK_SIZE_N": 32, "num_stages": 2, "SPLIT_K": 4}
    formats.merge_write_config(tmp_path / formats.config_file_name("sglang", 128, 256, formats.CPU_DEVICE_NAME),
                         {1: ok, 64: bad})
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-m", "servelab", "tune", "verify", str(tmp_path),
                          "--device", "cpu", "--kernel", "servelab", "--shipped", str(shipped),
                          "--batch-sizes", "1,64"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILED: 1 tuned config(s) did not launch, first N=128,K=256,M=64" in out.stdout
