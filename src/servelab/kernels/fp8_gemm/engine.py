"""The engines' own block-FP8 GEMM, found where the engine is installed, so launch configs are
timed on the kernel that will read them (servelab's `kernel.py` is the fallback).

SGLang 0.5.x keeps it in `sglang/kernels/ops/gemm/fp8_kernel.py`: `w8a8_block_fp8_matmul_triton`
looks up a config with `get_w8a8_block_fp8_configs` and, on sm90, launches its Hopper kernel
for entries with SPLIT_K > 1 or SWAP_AB (then reduces the split partials). vLLM keeps it in
`vllm/model_executor/layers/quantization/utils/fp8_utils.py` (`w8a8_triton_block_scaled_mm`,
same lookup name). The launcher is called as the engine calls it; only the lookup is replaced
by one that answers the config under test, so everything else (kernel choice, grid, split-K
reduction, output allocation) is the engine's own code.

Importing SGLang's module imports its runtime (psutil, zmq, msgspec, ...). Where those are
absent (a GPU box with only the wheel), `load("sglang")` executes the kernel file itself with
the four host helpers it imports supplied here (device name, platform facts, logging, the
custom-op decorator: none of them touches a kernel). Importing vLLM's module imports its
compiled ops and runtime; where that fails (torch other than the one its ops were built for,
packages absent) `load("vllm")` executes the kernel, launcher and lookup from vLLM's own file
(vllm_source.py). `EngineKernel.how` says which way it was loaded. Every config folder found
is the engine's own (`config_dir`).

Only SGLang's launcher reads SPLIT_K and SWAP_AB (on sm90); vLLM's passes every key of an
entry to its kernel, which reads the six tile keys only (Triton drops unknown keywords as
compile options: `EngineKernel.extra_keys`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.errors import UserError
from servelab.kernels.fp8_gemm import configs, vllm_source

ENGINES = ("sglang", "vllm")
KERNELS = ("servelab", *ENGINES)
# where each engine keeps its block-FP8 launcher (module, launcher, lookup function)
_SITES: dict[str, tuple[str, str, str]] = {
    "sglang": ("sglang.kernels.ops.gemm.fp8_kernel", "w8a8_block_fp8_matmul_triton",
               "get_w8a8_block_fp8_configs"),
    "vllm": ("vllm.model_executor.layers.quantization.utils.fp8_utils",
             "w8a8_triton_block_scaled_mm", "get_w8a8_block_fp8_configs"),
}


def engine_version(engine: str) -> str | None:
    """The installed distribution's version, or None when it is not installed."""
    try:
        return importlib.metadata.version(engine)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_dir(engine: str) -> Path | None:
    """Where the engine's package lives, found without importing it (None: not installed)."""
    try:
        spec = importlib.util.find_spec(engine)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def config_dir(engine: str) -> Path | None:
    """The folder the engine reads its block-FP8 config files from: beside its kernel module,
    `configs/` (SGLang 0.5.23: sglang/kernels/ops/gemm/configs; vLLM:
    vllm/model_executor/layers/quantization/utils/configs). None: engine not installed."""
    if engine not in _SITES:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    root = package_dir(engine)
    if root is None:
        return None
    rel = _SITES[engine][0].split(".")[1:]
    return root.joinpath(*rel).parent / "configs"


def _stub_sglang_helpers(device_name: Callable[[], str]) -> dict[str, types.ModuleType]:
    """Modules standing in for the SGLang host helpers fp8_kernel.py imports (see the module
    docstring); each answers as SGLang's own would on this machine."""
    import torch

    def is_cuda() -> bool:
        return torch.cuda.is_available() and torch.version.hip is None

    def is_hip() -> bool:
        return torch.version.hip is not None

    class _Platform:
        @property
        def is_sm90(self) -> bool:  # SGLang: device capability major 9 (and CUDA >= 12.3)
            return is_cuda() and torch.cuda.get_device_capability()[0] == 9

    def register_custom_op(fn: Any = None, **_: Any) -> Any:
        return fn if fn is not None else (lambda f: f)

    utils = types.ModuleType("sglang.srt.utils")
    utils.get_device_name = lambda device_id=0: device_name()
    utils.get_device_core_count = lambda device_id=0: (
        torch.cuda.get_device_properties(device_id).multi_processor_count if is_cuda() else 0)
    utils.is_cuda = is_cuda
    utils.is_hip = is_hip
    utils.is_gfx1250_supported = lambda: False
    utils.log_info_on_rank0 = lambda logger, msg: logger.info(msg)
    custom_op = types.ModuleType("sglang.srt.utils.custom_op")
    custom_op.register_custom_op = register_custom_op
    runtime = types.ModuleType("sglang.srt.runtime_context")
    platform = _Platform()
    runtime.get_platform = lambda: platform
    layers = types.ModuleType("sglang.srt.layers")
    dg = types.ModuleType("sglang.srt.layers.deep_gemm_wrapper")
    dg.ENABLE_JIT_DEEPGEMM = False
    layers.deep_gemm_wrapper = dg
    return {"sglang.srt.utils": utils, "sglang.srt.utils.custom_op": custom_op,
            "sglang.srt.runtime_context": runtime, "sglang.srt.layers": layers,
            "sglang.srt.layers.deep_gemm_wrapper": dg}


def _exec_file(path: Path, name: str, stubs: Mapping[str, types.ModuleType]) -> types.ModuleType:
    """Execute one source file as module `name` with `stubs` importable while it runs (they
    are removed from sys.modules afterwards; the module keeps its references)."""
    saved = {k: sys.modules.get(k) for k in stubs}
    parents = ("sglang", "sglang.srt")
    saved_parents = {k: sys.modules.get(k) for k in parents}
    for p in parents:                                     # empty parents: no SGLang __init__
        if sys.modules.get(p) is None:
            sys.modules[p] = types.ModuleType(p)
    sys.modules.update(stubs)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        for k, v in {**saved, **saved_parents}.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


@dataclass
class EngineKernel:
    """One engine's block-FP8 launcher, callable with an explicit config.

    `launch(a_q, a_s, b_q, b_s, config)` returns C [M, N] bf16 exactly as the engine computes it
    when its config lookup answers `config` for this (N, K, M)."""

    engine: str
    version: str | None
    source: str                      # the file the launcher came from
    how: str                         # "import" or "kernel file, host helpers supplied"
    module: types.ModuleType | None = None
    _config: dict[str, Any] = field(default_factory=dict)

    @property
    def extra_keys(self) -> frozenset[str]:
        """Entry keys beyond the six tile keys that this launcher reads (SGLang's sm90
        split-K and swapped-operand paths); others are not read here (vLLM's kernel gets them
        as keywords that Triton drops), so a config using them is a different launch."""
        return frozenset({"SPLIT_K", "SWAP_AB"}) if self.engine == "sglang" else frozenset()

    @property
    def label(self) -> str:
        """What a tuned file records as the kernel it was timed on."""
        if self.engine == "servelab":
            return "servelab kernels/fp8_gemm/kernel.py"
        return f"{self.engine} {self.version or '?'} {self.source} ({self.how})"

    def launch(self, a_q: Any, a_s: Any, b_q: Any, b_s: Any, config: Mapping[str, Any],
               out: Any = None) -> Any:
        import torch
        if self.module is None:                            # servelab's own kernel
            from servelab.kernels.fp8_gemm import kernel
            return kernel.w8a8_block_fp8_matmul(a_q, a_s, b_q, b_s, dict(config), out=out)
        self._config = dict(config)
        fn = getattr(self.module, _SITES[self.engine][1])
        return fn(a_q, b_q, a_s, b_s, [128, 128], torch.bfloat16)

    def shipped(self, n: int, k: int, device_name: str) -> dict[int, dict[str, Any]] | None:
        """The engine's shipped entries for (N, K) on `device_name`, read with servelab's reader
        from the engine's own config folder (None: it ships none)."""
        folder = config_dir(self.engine) if self.engine in ENGINES else None
        if folder is None:
            return None
        return configs.load(folder, n, k, device_name, self.engine)


def load(kernel: str, device_name: Callable[[], str] | None = None) -> EngineKernel:
    """The named kernel: 'servelab', or the installed engine's ('sglang', 'vllm'). UserError
    when the engine is not installed in this interpreter (name it and how to install it)."""
    if kernel == "servelab":
        return EngineKernel("servelab", None, "servelab/kernels/fp8_gemm/kernel.py", "import")
    if kernel not in _SITES:
        raise UserError(f"kernel '{kernel}': choose one of {', '.join(KERNELS)}")
    modname, _, lookup = _SITES[kernel]
    root = package_dir(kernel)
    if root is None:
        raise UserError(f"kernel '{kernel}': {kernel} is not installed in this interpreter "
                        f"({sys.executable}); install it, or use --kernel servelab")
    path = root.joinpath(*modname.split(".")[1:]).with_suffix(".py")
    version = engine_version(kernel)
    try:
        mod, how = importlib.import_module(modname), "import"
    except Exception as exc:  # noqa: BLE001 - any failure of the engine's runtime imports
        if not path.exists():
            raise UserError(f"kernel '{kernel}': cannot import {modname}: {exc}") from None
        import torch

        def dev() -> str:
            return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"

        if kernel == "vllm":
            try:
                mod = vllm_source.load(path, device_name or dev)
            except (ImportError, OSError, SyntaxError) as exc2:
                raise UserError(f"kernel 'vllm': cannot import {modname} ({exc}) nor run its "
                                f"kernel from the file ({exc2})") from None
        else:
            mod = _exec_file(path, f"servelab_engine_{kernel}_fp8", _stub_sglang_helpers(
                device_name or dev))
        how = "kernel file, host helpers supplied"
    ek = EngineKernel(kernel, version, str(path), how, mod)
    # the engine's lookup, answering the config under test; lru_cache'd originals are kept
    # on the module as `_servelab_lookup` for callers that want what the engine ships
    if not hasattr(mod, "_servelab_lookup"):
        mod._servelab_lookup = getattr(mod, lookup)
    setattr(mod, lookup, lambda n, k, bn, bk: {0: ek._config})
    return ek
