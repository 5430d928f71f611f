"""SGLang and vLLM block-FP8 GEMM config files: names, every key their files use, and
servelab's side file. The kernel owns its launch-config format; the tuner writes it.

Names, as the engines look them up (SGLang `fp8_kernel.get_w8a8_block_fp8_configs`, vLLM
`fp8_utils.get_w8a8_block_fp8_configs`):
  SGLang: N={N},K={K},device_name={dev},dtype=fp8_w8a8,block_shape=[128, 128].json  (a space)
  vLLM:   N={N},K={K},device_name={dev},dtype=fp8_w8a8,block_shape=[128,128].json
with dev = the GPU's name as each engine spells it: SGLang replaces each space by '_'
(`get_device_name().replace(" ", "_")`), vLLM each run of whitespace or '/' by one '_' (its
`get_device_name_as_file_name`). Contents: {"<M>": {entry}, ...}; the engines pick the entry
with the nearest M.

Keys of an entry, as SGLang 0.5.23's and vLLM 0.33.0's shipped files use them (counted over
all 137 + 244 block-FP8 files, scripts/engine_config_keys.py reproduces the census):
  always: BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps;
  num_stages   absent in 1296 of vLLM's ROCm entries: Triton's own default applies;
  SPLIT_K, SWAP_AB  SGLang's Hopper kernel (`_w8a8_block_fp8_matmul_hopper`), read on sm90;
  waves_per_eu, kpack, matrix_instr_nonkdim   AMD (ROCm) compiler hints, passed to Triton.
An entry keeps every key it was read with, so a merged or installed file loses nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab import atomic

REQUIRED_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps")
# optional integer keys and the smallest value each may take
OPTIONAL_INT_KEYS: dict[str, int] = {"num_stages": 1, "SPLIT_K": 1, "waves_per_eu": 0,
                                     "kpack": 1, "matrix_instr_nonkdim": 0}
OPTIONAL_BOOL_KEYS = ("SWAP_AB",)
# the order keys are written in (the engines' own files: the five, num_stages, then the rest)
KEY_ORDER = (*REQUIRED_KEYS, "num_stages", "SPLIT_K", "SWAP_AB", "waves_per_eu", "kpack",
             "matrix_instr_nonkdim")
CONFIG_KEYS = (*REQUIRED_KEYS, "num_stages")       # the six every NVIDIA entry servelab writes
# keys beyond the six that each engine's launcher reads on NVIDIA: vLLM 0.33.0 passes an
# entry's keys as keyword arguments to `_w8a8_triton_block_scaled_mm`, whose only
# meta-parameters are the four tile sizes; Triton takes any other keyword for a compile option
# and drops the unknown ones, so SPLIT_K / SWAP_AB there would launch a different config than
# the one timed, silently
ENGINE_EXTRA_KEYS: dict[str, frozenset[str]] = {"sglang": frozenset({"SPLIT_K", "SWAP_AB"}),
                                                "vllm": frozenset()}
FORMATS = ("sglang", "vllm")
CPU_DEVICE_NAME = "Triton_interpreter_CPU"  # the device name of --device cpu runs, in file names
_NAME_RE = re.compile(
    r"^N=(?P<n>\d+),K=(?P<k>\d+),device_name=(?P<dev>[^,]+),dtype=fp8_w8a8,"
    r"block_shape=\[(?P<bn>\d+),(?P<space> ?)(?P<bk>\d+)\]\.json$"
)

Entry = dict[str, int | bool]


def device_file_name(name: str, fmt: str = "sglang") -> str:
    """A GPU name as engine `fmt` puts it in file names (the module docstring); for the usual
    NVIDIA names ("NVIDIA H200") both give the same."""
    if fmt == "vllm":
        return re.sub(r"[\s/]+", "_", name)
    return name.replace(" ", "_")


def config_file_name(fmt: str, n: int, k: int, device_name: str,
                     block: tuple[int, int] = (128, 128)) -> str:
    """The file name the engine `fmt` ('sglang' or 'vllm') looks for."""
    sep = {"sglang": ", ", "vllm": ","}.get(fmt)
    if sep is None:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    dev = device_file_name(device_name, fmt)
    return (f"N={n},K={k},device_name={dev},dtype=fp8_w8a8,"
            f"block_shape=[{block[0]}{sep}{block[1]}].json")


def side_file_name(n: int, k: int, device_name: str) -> str:
    """servelab's metadata beside the engine files (no engine reads it)."""
    return f"N={n},K={k},device_name={device_file_name(device_name)},dtype=fp8_w8a8.servelab.json"


@dataclass(frozen=True, slots=True)
class ParsedName:
    """What a config file's name says."""

    fmt: str
    n: int
    k: int
    device: str
    block: tuple[int, int]


def parse_file_name(name: str) -> ParsedName | None:
    """The (format, N, K, device, block) of an engine config file name; None for other files."""
    m = _NAME_RE.match(name)
    if not m:
        return None
    fmt = "sglang" if m["space"] else "vllm"
    return ParsedName(fmt, int(m["n"]), int(m["k"]), m["dev"], (int(m["bn"]), int(m["bk"])))


def validate_entry(entry: Mapping[str, Any], where: str) -> Entry:
    """An entry with every key checked, in the engines' key order; ValueError naming what is
    missing, unknown or out of range."""
    known = set(KEY_ORDER)
    missing = [k for k in REQUIRED_KEYS if k not in entry]
    extra = [k for k in entry if k not in known]
    if missing or extra:
        raise ValueError(f"{where}: missing keys {missing}, unknown keys {extra} "
                         f"(known: {', '.join(KEY_ORDER)})")
    out: Entry = {}
    for key in KEY_ORDER:
        if key not in entry:
            continue
        v = entry[key]
        if key in OPTIONAL_BOOL_KEYS:
            if not isinstance(v, bool):
                raise ValueError(f"{where}: {key}={v!r} is not true/false")
            out[key] = v
            continue
        low = OPTIONAL_INT_KEYS.get(key, 1)
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ValueError(f"{where}: {key}={v!r} is not an integer >= {low}")
        _check_limit(key, v, where)
        out[key] = v
    tile = (out["BLOCK_SIZE_M"] + out["BLOCK_SIZE_N"]) * out["BLOCK_SIZE_K"]
    if tile > SHARED_MEMORY_BYTES:
        raise ValueError(f"{where}: one stage's A and B tiles need {tile:,} bytes of shared "
                         f"memory ((BLOCK_SIZE_M + BLOCK_SIZE_N) x BLOCK_SIZE_K, FP8), more than "
                         f"any GPU gives a block ({SHARED_MEMORY_BYTES:,})")
    return out


# The engines' real limits, so that a file no engine could launch is refused at install:
# Triton's block shapes are powers of two (tl.arange, tl.dot), a CTA runs at most 16 warps in
# the engines' launchers, and one pipeline stage's FP8 A and B tiles live in shared memory, of
# which Hopper and Blackwell give a block at most 227 KiB. (Stages are not multiplied in: how
# many buffers a stage count takes differs between Triton's NVIDIA and AMD pipeliners, and a
# shipped file must never be refused.)
SHARED_MEMORY_BYTES = 232_448
_POWER_OF_TWO_UP_TO = {"BLOCK_SIZE_M": 512, "BLOCK_SIZE_N": 512, "BLOCK_SIZE_K": 512,
                       "SPLIT_K": 64}
_RANGE = {"GROUP_SIZE_M": (1, 1024), "num_stages": (1, 8), "waves_per_eu": (0, 8)}
_CHOICES = {"num_warps": (1, 2, 4, 8, 16), "kpack": (1, 2), "matrix_instr_nonkdim": (0, 16, 32)}


def _check_limit(key: str, v: int, where: str) -> None:
    if key in _POWER_OF_TWO_UP_TO:
        top = _POWER_OF_TWO_UP_TO[key]
        if v > top or v & (v - 1):
            raise ValueError(f"{where}: {key}={v} is not a power of two <= {top}")
    elif key in _RANGE:
        lo, hi = _RANGE[key]
        if not lo <= v <= hi:
            raise ValueError(f"{where}: {key}={v} is outside {lo}..{hi}")
    elif key in _CHOICES and v not in _CHOICES[key]:
        raise ValueError(f"{where}: {key}={v} is not one of {', '.join(map(str, _CHOICES[key]))}")


def read_config_file(path: str | Path) -> dict[int, Entry]:
    """A config file's entries by M, in file order; ValueError on a malformed file."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path.name}: not JSON ({exc})") from exc
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path.name}: expected a non-empty object keyed by batch size")
    out: dict[int, Entry] = {}
    for key, entry in raw.items():
        if not str(key).isdigit():
            raise ValueError(f"{path.name}: key {key!r} is not a batch size")
        if not isinstance(entry, dict):
            raise ValueError(f"{path.name}: entry {key} is not an object")
        out[int(key)] = validate_entry(entry, f"{path.name}[{key}]")
    return out


def render_config_file(entries: Mapping[int, Mapping[str, Any]]) -> str:
    """The engines' JSON: keys are M as strings in ascending order, keys in the engines' order."""
    body = {str(m): validate_entry(entries[m], f"entry {m}") for m in sorted(entries)}
    return json.dumps(body, indent=4) + "\n"


def merge_write_config(path: str | Path, new: Mapping[int, Mapping[str, Any]]) -> dict[int, Entry]:
    """Merge `new` entries into the file at `path` (keeping every batch size already there) and
    write it atomically; returns the merged entries. A malformed existing file is an error, not
    something to overwrite."""
    path = Path(path)
    merged: dict[int, Entry] = read_config_file(path) if path.exists() else {}
    for m, entry in new.items():
        merged[int(m)] = validate_entry(entry, f"new entry {m}")
    atomic.write_text(path, render_config_file(merged))
    return merged


def merge_write_side(path: str | Path, meta: Mapping[str, Any],
                     points: Mapping[int, Mapping[str, Any]]) -> None:
    """Merge per-M tuning records into servelab's side file and write it atomically."""
    path = Path(path)
    old: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    pts = dict(old.get("points", {}))
    pts.update({str(m): dict(v) for m, v in points.items()})
    doc = {**old, **meta, "points": {k: pts[k] for k in sorted(pts, key=int)}}
    atomic.write_text(path, json.dumps(doc, indent=2, sort_keys=False) + "\n")


def unreadable_keys(fmt: str, entry: Mapping[str, Any]) -> list[str]:
    """Keys of `entry` that engine `fmt`'s launcher on NVIDIA does not read (empty: all read)."""
    ok = set(CONFIG_KEYS) | ENGINE_EXTRA_KEYS[fmt]
    return [k for k in entry if k not in ok]
