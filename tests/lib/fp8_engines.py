"""The engines' block-FP8 GEMM files, for the tests that read or run them.

The tests that need SGLang's or vLLM's source run where the engine is importable or its
wheel is unpacked on the path; servelab's own venv has neither (engines live in their own).
To check against the real engines:
  pip download --no-deps --only-binary=:all: sglang==0.5.23 vllm==0.33.0 -d /tmp/whl
  mkdir -p /tmp/eng && for w in /tmp/whl/*.whl; do unzip -qo "$w" -d /tmp/eng; done
  PYTHONPATH=src:/tmp/eng python -m pytest tests/kernels/fp8_gemm tests/tune tests/engines
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.kernels.fp8_gemm import engine as EK

H200 = "NVIDIA H200"
BASE = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
        "num_warps": 4}


def need_engine_dir(engine: str) -> Path:
    """The engine's config folder, or skip the test (see this module's docstring)."""
    folder = EK.config_dir(engine)
    if folder is None or not folder.is_dir():
        pytest.skip(f"{engine} is not importable here: see tests/lib/fp8_engines.py")
    return folder
