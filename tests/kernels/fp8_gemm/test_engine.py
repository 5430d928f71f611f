"""The engines' own block-FP8 GEMM launcher, imported or run from its kernel file, against
the fp64 reference (needs the engine: tests/lib/fp8_engines.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fp8_engines import BASE, need_engine_dir
from interpreter import interpreter_or_skip

from servelab.kernels.fp8_gemm import engine as EK

interpreter_or_skip("tests/kernels/fp8_gemm/test_engine.py")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_engine_launcher_runs_the_config_it_is_given(engine):
    """The engine's launcher (imported, or run from its kernel file: vLLM's from fp8_utils.py
    where vllm does not import) computes what the fp64 reference does."""
    from servelab.kernels.fp8_gemm import reference as R
    need_engine_dir(engine)
    ek = EK.load(engine)
    assert ek.engine == engine and ek.version and ek.how and Path(ek.source).is_file()
    assert ek.extra_keys == ({"SPLIT_K", "SWAP_AB"} if engine == "sglang" else set())
    torch.manual_seed(0)
    aq, as_ = R.quantize_per_token_group(torch.randn(5, 256))
    bq, bs = R.quantize_weight_per_block(torch.randn(256, 256) * 0.05)
    ref = R.w8a8_block_matmul(aq, as_, bq, bs)
    bound = 2.0 ** -8 * ref.abs() + 2.0 ** -7 * R.abs_matmul(aq, as_, bq, bs)
    for cfg in ({**BASE, "num_stages": 2}, {**BASE, "BLOCK_SIZE_N": 32, "num_stages": 3}):
        out = ek.launch(aq, as_, bq, bs, cfg)
        err = (out.double() - ref).abs()
        assert int((err > bound).sum()) == 0, f"{cfg}: max err {float(err.max()):.3g}"
