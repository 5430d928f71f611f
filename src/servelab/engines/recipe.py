"""Launch recipes as data: `recipes/<name>.toml` holds flags per engine, env, and constraints
(rules a configuration must meet, e.g. DeepSeek-V4 MTP needs EAGLE with topk 1).

Constraints of every recipe are checked against every process, whether or not an arm names the
recipe: they are facts about engines and models, and a hand-written flag set must meet them too.
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.engines.base import FlagValue
from servelab.errors import UserError

RECIPE_DIR = Path(__file__).parent / "recipes"


@dataclass(frozen=True, slots=True)
class Constraint:
    model: str  # regex on the model name
    when_set: tuple[str, ...]  # applies when any of these flags is set
    require: dict[str, tuple[Any, ...]]
    message: str

    def violations(self, model: str, flags: Mapping[str, FlagValue]) -> list[str]:
        """Problems of `flags` for `model` (empty when it holds or does not apply)."""
        if not re.search(self.model, model):
            return []
        if self.when_set and not any(flags.get(k) not in (None, False) for k in self.when_set):
            return []
        bad = [
            f"{k}={flags.get(k)!r}"
            for k, allowed in self.require.items()
            if flags.get(k) not in allowed
        ]
        return [f"{self.message} (got {', '.join(bad)})"] if bad else []


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str
    description: str
    source: str
    flags: dict[str, dict[str, FlagValue]]  # engine -> flags
    env: dict[str, str]
    engines: tuple[str, ...]  # engines it applies to
    constraints: tuple[Constraint, ...] = field(default_factory=tuple)

    def flags_for(self, engine: str) -> dict[str, FlagValue]:
        if engine not in self.engines:
            raise UserError(
                f"recipe '{self.name}' has no settings for engine '{engine}' "
                f"(it has: {', '.join(self.engines)})"
            )
        return dict(self.flags.get(engine, {}))


def _parse(path: Path) -> Recipe:
    data = tomllib.loads(path.read_text())
    flags = {eng: dict(v) for eng, v in data.get("flags", {}).items()}
    cons = tuple(
        Constraint(
            model=c.get("model", ".*"),
            when_set=tuple(c.get("when_set", ())),
            require={k: tuple(v if isinstance(v, list) else [v]) for k, v in c["require"].items()},
            message=c["message"],
        )
        for c in data.get("constraints", [])
    )
    return Recipe(
        name=data["name"],
        description=data.get("description", ""),
        source=data.get("source", ""),
        flags=flags,
        env={k: str(v) for k, v in data.get("env", {}).items()},
        engines=tuple(data.get("engines") or flags.keys()),
        constraints=cons,
    )


@functools.cache
def all_recipes() -> dict[str, Recipe]:
    """Every shipped recipe by name."""
    return {r.name: r for r in (_parse(p) for p in sorted(RECIPE_DIR.glob("*.toml")))}


def get(name: str) -> Recipe:
    recipes = all_recipes()
    if name not in recipes:
        raise UserError(f"unknown recipe '{name}' (known: {', '.join(sorted(recipes))})")
    return recipes[name]


def constraint_problems(model: str, flags: Mapping[str, FlagValue]) -> list[str]:
    """Violations of any recipe's constraints (deduplicated)."""
    seen: dict[str, None] = {}
    for r in all_recipes().values():
        for c in r.constraints:
            for p in c.violations(model, flags):
                seen[p] = None
    return list(seen)
