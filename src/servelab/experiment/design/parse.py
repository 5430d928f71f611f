"""An experiment file or a stored spec into the typed model (design/model.py).

A bad file gives ONE line naming the key and the problem (`parse`, `read`); the checks that
judge the commands it would launch are the plan's (experiment/plan/preflight.py). A spec read
back from a results store (`from_store`) goes through the same model, so its defaults live in
one place, with the tolerance an older store needs (design/base.py).
"""

from __future__ import annotations

import stat
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from servelab.errors import UserError
from servelab.experiment.design.base import STORED
from servelab.experiment.design.model import MAX_REPETITIONS, ExperimentSpec

# pydantic names the member of a union that failed as one more location part ('str', 'int',
# 'list[union[str,int,float]]'); a flag value is wrong as a whole, so the location stops there
_UNION_MEMBERS = ("str", "int", "float", "bool")
# keys whose type is a union of their own: what to say instead of the flag-value message
_UNION_MESSAGES = {
    "repetitions": f'must be a whole number from 1 to {MAX_REPETITIONS}, or "auto" (quoted)',
    "noise.pin": 'must be true, false or "auto"',
}


def _loc(loc: tuple[Any, ...]) -> tuple[str, bool]:
    """(dotted key, whether it ended at a union member)."""
    parts: list[str] = []
    for p in loc:
        if isinstance(p, str) and (p in _UNION_MEMBERS or p.startswith(("list[", "literal["))):
            return ".".join(parts), True
        if not (isinstance(p, str) and p.startswith("function-")):
            parts.append(str(p))
    return ".".join(parts), False


# an experiment file is a page of settings; past this it is not one (/dev/zero, a log)
MAX_FILE_BYTES = 1 << 20
# what SQLite, orjson and the engines' own parsers can hold; a value past it would fail late,
# inside the design hash or a launch, instead of here
_INT_RANGE = (-(1 << 63), (1 << 63) - 1)


def _out_of_range(data: Any, path: str = "") -> str | None:
    """The dotted key of the first integer no store or engine can hold, or None."""
    if isinstance(data, bool):
        return None
    if isinstance(data, int):
        return path or "(top level)" if not _INT_RANGE[0] <= data <= _INT_RANGE[1] else None
    if isinstance(data, float):
        return None
    items = (data.items() if isinstance(data, dict)
             else enumerate(data) if isinstance(data, list) else ())
    for k, v in items:
        found = _out_of_range(v, f"{path}.{k}" if path else str(k))
        if found:
            return found
    return None


def parse(data: dict[str, Any], source: str = "<experiment>") -> ExperimentSpec:
    """Validate a dict; a problem becomes ONE line: `source: key.path: problem`."""
    try:
        where = _out_of_range(data)
    except RecursionError:
        raise UserError(f"{source}: nested too deeply to be an experiment file") from None
    if where is not None:
        raise UserError(f"{source}: {where}: a number beyond 64-bit integers; no engine or "
                        "store takes it")
    try:
        return ExperimentSpec.model_validate(data)
    except ValidationError as exc:
        errs = exc.errors()
        keys = list(dict.fromkeys(_loc(e["loc"]) for e in errs))  # one per key, in order
        e = errs[0]
        key, union = keys[0]
        key = key or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if union and key in _UNION_MESSAGES:
            msg = _UNION_MESSAGES[key]
        elif union:
            msg = "must be a string, a number, true/false, or a list of strings and numbers"
        elif e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; docs/EXPERIMENTS.md lists the keys)"
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif e["type"] == "string_pattern_mismatch":
            msg = f"{e['input']!r} must be letters, digits, '-', '_' or '.' (a letter or digit first)"
        more = (
            f" (and {len(keys) - 1} more problem{'s' if len(keys) > 2 else ''})"
            if len(keys) > 1
            else ""
        )
        raise UserError(f"{source}: {key}: {msg}{more}") from None


def read(path: str | Path, transform: Callable[[dict], dict] | None = None) -> ExperimentSpec:
    """Read and validate an experiment file; raises UserError with one line. `transform`
    rewrites the parsed TOML before validation (the demo's quick variant)."""
    p = Path(path)
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{p} is not a regular file; give an experiment file (.toml)")
        if st.st_size > MAX_FILE_BYTES:
            raise UserError(f"{p} is {st.st_size:,} bytes: an experiment file is at most "
                            f"{MAX_FILE_BYTES:,}")
        with p.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)     # the file may grow between stat and read
        if len(raw) > MAX_FILE_BYTES:
            raise UserError(f"{p} is over {MAX_FILE_BYTES:,} bytes: not an experiment file")
        text = raw.decode()
    except OSError as exc:
        raise UserError(f"cannot read experiment file {p}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{p}: not UTF-8 text (byte {exc.start}); an experiment file is TOML") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{p}: invalid TOML: {exc}") from None
    except RecursionError:
        raise UserError(f"{p}: nested too deeply to be an experiment file") from None
    if transform is not None:
        data = transform(data)
    return parse(data, str(p))


def from_store(data: dict[str, Any]) -> ExperimentSpec:
    """The spec as a results store holds it (experiments.spec, `ExperimentSpec.to_json()` of
    the release that ran it) as the typed model: keys an older release stored and this one
    dropped are left out, checks that depend on this release's engines and metrics are not
    run again; pydantic's ValidationError when it is not a spec at all."""
    return ExperimentSpec.model_validate(data, context=STORED)
