"""What every importer shares: the validation of one field (a bad one raises `Bad`, turned
into a one-line UserError naming file, entry and field), the protocol families, the reading of
a JSON / JSONL file, and `Entry`, one load point as an importer hands it to the store."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.errors import UserError

MAX_COUNT = 10**9  # requests or tokens of one benchmark: more is a corrupt file, not a result
MAX_FILE_BYTES = 1 << 30

# The protocol a benchmark spoke, by the `backend` / `endpoint_type` / `api` names of SGLang,
# vLLM and servelab: results over the same protocol compare, whatever tool measured them.
PROTOCOLS = {
    "openai-completions": ("completions", "openai", "vllm", "sglang-oai", "lmdeploy",
                           "openai-completions", "tgi", "deepspeed-mii", "/v1/completions"),
    "openai-chat": ("chat", "openai-chat", "sglang-oai-chat", "vllm-chat", "openai-chat-completions",
                    "/v1/chat/completions", "chat_completions"),
    "sglang-generate": ("sglang", "sglang-native", "generate"),
}
_HTTP = re.compile(r"\b([45]\d\d) (?:[A-Z][a-z]+ ?)+")  # "500 Internal Server Error"
_PROTOCOL_OF = {name: proto for proto, names in PROTOCOLS.items() for name in names}


def protocol_of(api: Any) -> str | None:
    """The protocol family of a tool's backend name (None when unknown or missing)."""
    return _PROTOCOL_OF.get(api.lower()) if isinstance(api, str) else None

class Bad(Exception):
    """A field of one entry is invalid (turned into a UserError naming file and entry)."""


def num(obj: dict[str, Any], key: str, *, lo: float | None = 0.0, hi: float | None = None,
         nan_ok: bool = True) -> float | None:
    """A finite number within [lo, hi], or None when absent, null or NaN (tools write NaN for
    'no data'); anything else is an error naming the field."""
    x = obj.get(key)
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise Bad(f"'{key}' must be a number, got {show(x)}")
    if isinstance(x, float) and math.isnan(x):
        if nan_ok:
            return None
        raise Bad(f"'{key}' must be a number, got NaN")
    if math.isinf(x) or (lo is not None and x < lo) or (hi is not None and x > hi):
        want = f">= {lo:g}" if hi is None else f"in [{lo:g}, {hi:g}]"
        raise Bad(f"'{key}' must be a finite number {want}, got {show(x)}")
    return float(x)


def count(obj: dict[str, Any], key: str, required: bool = False) -> int | None:
    x = obj.get(key)
    if x is None and not required:
        return None
    if isinstance(x, bool) or not isinstance(x, int | float) or (
            isinstance(x, float) and not x.is_integer()) or not 0 <= x <= MAX_COUNT:
        raise Bad(f"'{key}' must be a whole number in [0, {MAX_COUNT:,}], got {show(x)}")
    return int(x)


def text(obj: dict[str, Any], key: str) -> str | None:
    x = obj.get(key)
    if x is None:
        return None
    if not isinstance(x, str):
        raise Bad(f"'{key}' must be a string, got {show(x)}")
    return x


def show(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 40 else r[:37] + "..."


def ok_num(x: Any) -> bool:
    return (not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x)
            and x >= 0)


def reason(err: str) -> str:
    """The grouping key of an error message: `http_<status>` when it names an HTTP error status
    ("Server error '500 Internal Server Error'"), else its last non-blank line (a traceback's
    exception)."""
    m = _HTTP.search(err)
    if m:
        return f"http_{m.group(1)}"
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    return lines[-1][:80] if lines else "(no message)"


def load_objects(path: Path) -> tuple[list[dict[str, Any]], bytes]:
    """The result objects of the file and its bytes."""
    if path.stat().st_size > MAX_FILE_BYTES:
        raise UserError(f"{path}: {path.stat().st_size:,} bytes is larger than any benchmark "
                        f"result ({MAX_FILE_BYTES:,} at most)")
    data = path.read_bytes()
    # Python's json, not orjson: these tools write `Infinity`/`NaN` (json.dumps of request_rate=inf)
    text = data.decode("utf-8", errors="replace")
    try:
        obj = json.loads(text)
        objs = obj if isinstance(obj, list) else [obj]
    except (ValueError, RecursionError):
        objs = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                objs.append(json.loads(line))
            except (ValueError, RecursionError) as exc:
                raise UserError(f"{path}: line {n} is not JSON ({str(exc)[:120]}); nothing "
                                "was imported") from None
    if not objs or not all(isinstance(o, dict) for o in objs):
        raise UserError(f"{path}: expected JSON objects (one per line for SGLang); nothing was "
                        "imported")
    return objs, data



@dataclass
class Entry:
    """One load point read from a file: our summary, per-request records (may be empty), the
    model, and what goes into provenance besides the file (date, server arguments)."""

    summary: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None
    date: str | None = None
    server_info: dict[str, Any] | None = None


def read_json(path: Path) -> tuple[Any, bytes]:
    """One JSON document (any top-level type) and the file's bytes; size-checked."""
    if path.stat().st_size > MAX_FILE_BYTES:
        raise UserError(f"{path}: {path.stat().st_size:,} bytes is larger than any benchmark "
                        f"result ({MAX_FILE_BYTES:,} at most)")
    data = path.read_bytes()
    try:
        return json.loads(data.decode("utf-8", errors="replace")), data
    except (ValueError, RecursionError) as exc:
        raise UserError(f"{path}: not JSON ({str(exc)[:120]}); nothing was imported") from None


def sub(obj: dict[str, Any], key: str) -> dict[str, Any] | None:
    """A nested object, or None when absent/null; anything else is Bad."""
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, dict):
        raise Bad(f"'{key}' must be an object, got {show(v)}")
    return v


@contextmanager
def at(where: str) -> Iterator[None]:
    """Prefix a Bad raised inside with where it was found (`benchmarks[1].metrics`)."""
    try:
        yield
    except Bad as exc:
        raise Bad(f"{where}: {exc}") from None


def scaled(stats: dict[str, float | None], factor: float) -> dict[str, float | None]:
    """A latency object in other units (seconds -> ms: 1000)."""
    return {k: (v * factor if v is not None else None) for k, v in stats.items()}
