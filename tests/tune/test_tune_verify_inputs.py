"""`tune verify`'s bad input: a one-line error naming the option, before any timing. Before:
`--device gpu` and `--engine foo` ended as "internal error" (torch's and formats' exceptions),
and a `--shipped` folder that does not exist was silently taken as "the engine ships nothing",
so the table labelled the default's timing as the shipped one."""

from __future__ import annotations

from pathlib import Path

import pytest

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

