"""Attention backends (model/attention.py): the sparse MLA Triton kernels (naive, splitkv) give
the torch backend's greedy tokens through a whole engine, and refuse the CPU without Triton's
interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from mini_engines import engine

from servelab.errors import UserError

KERNEL_CHECK = """
import sys
from servelab.mini.model import tokenizer as tk
from servelab.mini.engine.args import EngineArgs
from servelab.mini.engine.engine import Engine
from servelab.mini.engine.sampling import SamplingParams
out = []
for backend in ("torch", sys.argv[1]):
    e = Engine(EngineArgs(config="micro", random_weights=True, attention_backend=backend,
                          context_length=64, max_running_requests=2))
    sp = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    out.append([e.generate(tk.encode(p), sp)[0] for p in ("hello world", "import os")])
print(out[0] == out[1], out)
"""


@pytest.mark.parametrize("backend", ["naive", "splitkv"])
def test_kernel_attention_backends_match_torch(backend):
    """--attention-backend naive|splitkv (the sparse MLA Triton kernels, interpreted on the CPU)
    gives the same greedy tokens as our torch gather + softmax. A subprocess, because Triton
    decides at import time whether kernels are interpreted."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", KERNEL_CHECK, backend], env=env,
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("True"), res.stdout


def test_kernel_backend_on_cpu_needs_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(UserError, match="--device cuda"):
        engine(attention_backend="splitkv")
