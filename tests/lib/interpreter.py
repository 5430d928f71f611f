"""Tests that run Triton kernels in the CPU interpreter, on any machine.

Triton decides interpreted or compiled for each @triton.jit function when it is decorated
(its own helpers when triton is imported), so TRITON_INTERPRET must be set before any kernel
module is imported, and it then holds for every kernel module imported later in the process.
Without CUDA the interpreter is on for the whole suite anyway; on a GPU machine turning it on
from one test module made the sparse-MLA kernels imported after it interpreted too (147 GPU
tests failed on the H200), so there interpreter tests run only in a process started with
TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os

import pytest
import torch


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreter_or_skip(test_path: str, module_level: bool = True) -> None:
    """Without CUDA: turn the interpreter on (if no one has). With CUDA and no
    TRITON_INTERPRET: skip, naming the command that runs `test_path`."""
    if not torch.cuda.is_available():
        if module_level:
            os.environ.setdefault("TRITON_INTERPRET", "1")
    elif not interpreting():
        pytest.skip(f"interpreter tests: on a GPU machine run them as TRITON_INTERPRET=1 "
                    f"python -m pytest {test_path}", allow_module_level=module_level)  # fmt: skip
