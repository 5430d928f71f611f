"""vLLM's block-FP8 GEMM run from vLLM's own source files where `vllm` does not import.

Importing `fp8_utils` imports vLLM's runtime: its compiled ops (built for one torch version),
its platform detection, ZMQ, transformers... A GPU box with another torch, or a CI machine
with the wheel only unpacked, cannot. The Triton path needs none of that, so this module
executes, from vLLM's own files and unchanged:
  fp8_utils.py       `_w8a8_triton_block_scaled_mm` (the Triton kernel),
                     `w8a8_triton_block_scaled_mm` (the launcher: config pick, grid, launch),
                     `get_w8a8_block_fp8_configs` (the lookup: file name, `configs/` folder
                     beside the file, JSON read), `_upcast_e8m0_to_fp32`;
  platform_utils.py  `get_device_name_as_file_name` (vLLM's own device-name spelling).
The names they take from the rest of vLLM are supplied here and say so: `current_platform`
(not ROCm; the device name torch reports, or the one the caller substitutes), `envs`
(VLLM_BATCH_INVARIANT off, vLLM's default) and a logger. The one import inside
`get_device_name_as_file_name` (`from vllm.platforms import current_platform`) is removed so
that name resolves to the supplied platform; nothing else is changed. The module's `__file__`
is the real fp8_utils.py, so the lookup reads the folder vLLM itself reads.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import os
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

FP8_UTILS_FUNCS = ("_w8a8_triton_block_scaled_mm", "get_w8a8_block_fp8_configs",
                   "w8a8_triton_block_scaled_mm", "_upcast_e8m0_to_fp32")
HOW = "kernel file, host helpers supplied"


class Platform:
    """Stands in for vLLM's `current_platform` where the Triton path asks it something."""

    def __init__(self, device_name: Callable[[], str]) -> None:
        self._name = device_name

    def get_device_name(self, device_id: int = 0) -> str:
        return self._name()

    @staticmethod
    def is_rocm() -> bool:
        return False


def _functions(path: Path, names: Sequence[str]) -> list[ast.stmt]:
    """The named top-level function definitions of `path`, in file order; ImportError naming
    the ones this vLLM version does not have."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = sorted(set(names) - {n.name for n in found})
    if missing:
        raise ImportError(f"{path}: no {', '.join(missing)} (a vLLM version this loader "
                          "does not know)")
    return found


def _drop_platform_import(fn: ast.FunctionDef) -> ast.FunctionDef:
    fn.body = [s for s in fn.body if not (isinstance(s, ast.ImportFrom)
                                          and s.module == "vllm.platforms")]
    return fn


def load(fp8_utils: Path, device_name: Callable[[], str],
         name: str = "servelab_vllm_fp8_utils") -> types.ModuleType:
    """vLLM's kernel, launcher and lookup as a module (see the module docstring)."""
    import torch
    import triton
    import triton.language as tl
    try:
        import regex as re  # what vLLM's platform_utils imports
    except ImportError:
        import re
    root = fp8_utils.resolve().parents[4]          # .../vllm
    platform = Platform(device_name)
    mod = types.ModuleType(name)
    mod.__file__ = str(fp8_utils)
    mod.__dict__.update(
        functools=functools, json=json, os=os, torch=torch, triton=triton, tl=tl, re=re,
        Any=Any, Callable=Callable, Sequence=Sequence, current_platform=platform,
        envs=types.SimpleNamespace(VLLM_BATCH_INVARIANT=False),
        logger=logging.getLogger("vllm.fp8_utils"), cache=functools.cache)
    plat_utils = root / "utils" / "platform_utils.py"
    lookup_name = [_drop_platform_import(f) for f in _functions(  # type: ignore[arg-type]
        plat_utils, ("get_device_name_as_file_name",))]
    exec(compile(ast.Module(body=lookup_name, type_ignores=[]), str(plat_utils), "exec"),
         mod.__dict__)
    body = _functions(fp8_utils, FP8_UTILS_FUNCS)
    # compiled under the real file name with the real line numbers: Triton reads the kernel's
    # source back through inspect, from vLLM's file
    exec(compile(ast.Module(body=body, type_ignores=[]), str(fp8_utils), "exec"), mod.__dict__)
    mod.servelab_platform = platform
    return mod
