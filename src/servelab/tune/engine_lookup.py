"""Ask the engine's own config lookup which file it reads: SGLang's and vLLM's
`get_w8a8_block_fp8_configs`, called as the engine calls it, in the engine's interpreter.

servelab writes files named as it believes the engines look them up (formats.py). This asks
the engines themselves: for each (N, K, device name) the engine's own function builds the
file name (its own device-name spelling: vLLM replaces runs of whitespace and '/', SGLang
single spaces), looks in its `configs/` folder and reads the JSON. Only the device name is
substituted (the machine running the check need not have that GPU): SGLang's `get_device_name`
in its kernel module, vLLM's `current_platform.get_device_name` (its own
`get_device_name_as_file_name` still spells it). With `folder`, the function reads that folder
instead of the installed one: the module's `__file__` points beside a `configs` link to it, the
one thing the lookup derives its folder from.

Runs in this interpreter (`lookup`) or in the engine's own (`lookup_in`: this file is run
there as a script with servelab's source on the path; it imports only the standard library,
torch and Triton, and the engine).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

Query = tuple[int, int, str | None]   # N, K, the device name as torch/NVML report it
                                      # (None: the engine's own answer on this machine)
SRC = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def device_named(ek: Any, name: str | None) -> Iterator[None]:
    """The engine module answers `name` when its lookup asks for the device's name (None:
    nothing substituted, the engine asks the GPU itself)."""
    mod = ek.module
    if name is None:
        yield
        return
    if ek.engine == "sglang":
        saved = mod.get_device_name
        mod.get_device_name = lambda device_id=0: name
        try:
            yield
        finally:
            mod.get_device_name = saved
        return
    spell = mod.get_device_name_as_file_name
    if hasattr(mod, "servelab_platform"):                  # run from vLLM's file
        plat = mod.servelab_platform
    else:                                                   # imported: vLLM's own platform
        from vllm.platforms import current_platform as plat
    had = "get_device_name" in vars(plat)
    saved = vars(plat).get("get_device_name")
    spell.cache_clear()
    plat.get_device_name = lambda device_id=0: name
    try:
        yield
    finally:
        if had:
            plat.get_device_name = saved
        else:
            del plat.get_device_name
        spell.cache_clear()


@contextlib.contextmanager
def _reading(mod: Any, folder: Path | None) -> Iterator[None]:
    """The lookup reads `folder` (None: where the engine's file is, its own folder)."""
    if folder is None:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="servelab-lookup-") as tmp:
        (Path(tmp) / "configs").symlink_to(Path(folder).resolve(), target_is_directory=True)
        saved = mod.__file__
        mod.__file__ = str(Path(tmp) / Path(saved).name)
        try:
            yield
        finally:
            mod.__file__ = saved


def lookup(engine: str, queries: Sequence[Query], folder: Path | None = None,
           ) -> dict[str, Any]:
    """What the engine's own lookup returns for each query (entries keyed by M as strings, or
    None), with how the engine was loaded; in this interpreter."""
    from servelab.kernels.fp8_gemm import engine as engine_kernel
    ek = engine_kernel.load(engine)
    fn = ek.module._servelab_lookup                        # the engine's own function
    found: list[dict[str, Any] | None] = []
    read: list[str | None] = []
    with _reading(ek.module, folder), _watching_exists() as asked:
        for n, k, dev in queries:
            n0 = len(asked)
            with device_named(ek, dev):
                fn.cache_clear()
                got = fn(n, k, 128, 128)
                fn.cache_clear()
            found.append(None if got is None else {str(m): v for m, v in got.items()})
            mine = asked[n0:]                                  # its own check is the last
            path, there = mine[-1] if mine else (None, False)
            read.append(os.path.realpath(path) if there and path else None)
    return {"engine": engine, "version": ek.version, "how": ek.how, "source": ek.source,
            "function": f"{ek.source}:get_w8a8_block_fp8_configs", "found": found,
            "read": read}


@contextlib.contextmanager
def _watching_exists() -> Iterator[list[tuple[str, bool]]]:
    """Every `os.path.exists` call while inside, with its answer (the engines' lookups ask it
    for the one file they then open)."""
    asked: list[tuple[str, bool]] = []
    real = os.path.exists

    def watch(path: Any) -> bool:
        there = real(path)
        asked.append((str(path), there))
        return there

    os.path.exists = watch
    try:
        yield asked
    finally:
        os.path.exists = real


# device names as torch/NVML report them, chosen to show each engine's spelling: runs of
# spaces, a '/', names already spelt
SAMPLE_DEVICES = ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA  RTX PRO/6000",
                  "Triton_interpreter_CPU")
_N, _K = 1111, 2222                                       # sentinels, found in the name


def record(engine: str) -> dict[str, Any]:
    """The file names and folder the engine's own lookup reads, for a generated table
    (scripts/gen_engine_flags.py lookup ENGINE): its `os.path.exists` is watched while it
    looks up a sentinel shape on each sample device; nothing is read."""
    from servelab.kernels.fp8_gemm import engine as engine_kernel
    ek = engine_kernel.load(engine)
    fn = ek.module._servelab_lookup
    asked: list[str] = []
    real_exists = os.path.exists

    def watch(path: Any) -> bool:
        asked.append(str(path))
        return False

    paths: list[str] = []
    os.path.exists = watch
    try:
        for dev in SAMPLE_DEVICES:
            with device_named(ek, dev):
                fn.cache_clear()
                fn(_N, _K, 128, 128)
            paths.append(asked[-1])                  # its own check is the last one
    finally:
        os.path.exists = real_exists
        fn.cache_clear()
    folder = Path(paths[0]).parent                   # (a '/' in a device name is a folder
    names = [p[len(str(folder)) + 1:] for p in paths]  # to SGLang: keep the whole rest)
    spelt = {dev: name.split("device_name=", 1)[1].split(",dtype=", 1)[0]
             for dev, name in zip(SAMPLE_DEVICES, names, strict=True)}
    pkg = engine_kernel.package_dir(engine)
    template = (names[-1].replace(f"N={_N},", "N={N},").replace(f"K={_K},", "K={K},")
                .replace(f"device_name={spelt[SAMPLE_DEVICES[-1]]},", "device_name={device},"))
    table: dict[str, Any] = {
        "engine": engine, "version": ek.version, "function": "get_w8a8_block_fp8_configs",
        "source": str(Path(ek.source).relative_to(pkg.parent)) if pkg else ek.source,
        "folder": str(folder.resolve().relative_to(pkg.parent.resolve())) if pkg else str(folder),
        "file_name": template, "device_spelling": spelt,
    }
    if engine == "vllm":       # the keyword arguments its launcher passes an entry's keys to
        table["launch_keys"] = sorted({*_constexpr_args(Path(ek.source),
                                                        "_w8a8_triton_block_scaled_mm"),
                                       "num_warps", "num_stages"})
    return table


def _constexpr_args(path: Path, kernel: str) -> list[str]:
    """The `tl.constexpr` parameters of a Triton kernel, read from its source."""
    import ast
    fn = next(n for n in ast.parse(path.read_text()).body
              if isinstance(n, ast.FunctionDef) and n.name == kernel)
    return [a.arg for a in fn.args.args
            if isinstance(a.annotation, ast.Attribute) and a.annotation.attr == "constexpr"]


def lookup_in(python: str | None, engine: str, queries: Sequence[Query],
              folder: Path | None = None, timeout_s: float = 300.0) -> dict[str, Any]:
    """`lookup` run in the interpreter `python` (None: this one, in-process). RuntimeError
    with the interpreter's last line when it fails there."""
    if python is None:
        return lookup(engine, queries, folder)
    arg = json.dumps({"engine": engine, "queries": [list(q) for q in queries],
                      "folder": str(folder) if folder else None})
    env = {**os.environ, "SERVELAB_SRC": str(SRC)}
    got = subprocess.run([python, str(Path(__file__).resolve()), arg], capture_output=True,
                         text=True, timeout=timeout_s, env=env)
    if got.returncode != 0:
        tail = (got.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{python}: the {engine} lookup failed: {tail}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def _main(arg: str) -> int:
    if arg.startswith("record:"):
        sys.stdout.write("\n" + json.dumps(record(arg.split(":", 1)[1])) + "\n")
        return 0
    a = json.loads(arg)
    out = lookup(a["engine"], [tuple(q) for q in a["queries"]],
                 Path(a["folder"]) if a["folder"] else None)
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.path[0] = os.environ.get("SERVELAB_SRC", str(SRC))   # not this file's folder
    sys.exit(_main(sys.argv[1]))
