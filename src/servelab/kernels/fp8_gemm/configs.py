"""Launch-config lookup as the engines do it: a JSON file per (N, K, device), nearest M wins.

SGLang and vLLM load `{M: config}` and take `configs[min(configs, key=lambda m: abs(m - M))]`:
the first of equally near keys in file order wins (files list M ascending, so the smaller).
With no file they use one default config for every M.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from servelab.kernels.fp8_gemm import formats

# The engines' defaults when no tuned file exists (SGLang fp8_kernel.py; vLLM fp8_utils.py
# differs only in num_stages=2).
DEFAULT_CONFIG: dict[str, dict[str, int]] = {
    "sglang": {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
               "num_warps": 4, "num_stages": 3},
    "vllm": {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
             "num_warps": 4, "num_stages": 2},
}


def default_config(engine: str = "sglang") -> dict[str, int]:
    """The config an engine uses when it finds no tuned file."""
    if engine not in DEFAULT_CONFIG:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(DEFAULT_CONFIG)}")
    return dict(DEFAULT_CONFIG[engine])


def nearest(entries: Mapping[int, Mapping[str, int]], m: int) -> dict[str, int]:
    """The entry whose key is nearest to m; ties go to the key met first (file order)."""
    if not entries:
        raise ValueError("no entries to choose from")
    best = min(entries, key=lambda key: abs(int(key) - m))
    return dict(entries[best])


def load(directory: str | Path, n: int, k: int, device_name: str,
         engine: str = "sglang") -> dict[int, dict[str, int]] | None:
    """The tuned entries for (N, K) on `device_name` from `directory`, or None when no file exists."""
    path = Path(directory) / formats.config_file_name(engine, n, k, device_name)
    if not path.exists():
        return None
    return formats.read_config_file(path)


def lookup(directory: str | Path | None, n: int, k: int, m: int, device_name: str,
           engine: str = "sglang") -> dict[str, int]:
    """The config an engine would launch for an (M, N, K) GEMM: nearest-M entry of the tuned file,
    or the engine default when there is no file."""
    entries = load(directory, n, k, device_name, engine) if directory is not None else None
    return nearest(entries, m) if entries else default_config(engine)
