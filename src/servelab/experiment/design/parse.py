"""An experiment file or a stored spec into the typed model (design/model.py).

A bad file gives ONE line naming the key and the problem (`parse`, `read`); the checks that
judge the commands it would launch are the plan's (experiment/plan/preflight.py). A spec read
back from a results store (`from_store`) goes through the same model, so its defaults live in
one place, with the tolerance an older store needs (design/base.py).
"""

from __future__ import annotations

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


def parse(data: dict[str, Any], source: str = "<experiment>") -> ExperimentSpec:
    """Validate a dict; a problem becomes ONE line: `source: key.path: problem`."""
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
        text = p.read_text()
    except OSError as exc:
        raise UserError(f"cannot read experiment file {p}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{p}: invalid TOML: {exc}") from None
    if transform is not None:
        data = transform(data)
    return parse(data, str(p))


def from_store(data: dict[str, Any]) -> ExperimentSpec:
    """The spec as a results store holds it (experiments.spec, `ExperimentSpec.to_json()` of
    the release that ran it) as the typed model: keys an older release stored and this one
    dropped are left out, checks that depend on this release's engines and metrics are not
    run again; pydantic's ValidationError when it is not a spec at all."""
    return ExperimentSpec.model_validate(data, context=STORED)
