"""Engine adapters (how to start and observe a serving engine) and launch recipes as data."""

from __future__ import annotations

from servelab.engines.base import Engine
from servelab.engines.command import Command
from servelab.engines.embedded import Embedded
from servelab.engines.external import External
from servelab.engines.sglang import SGLang
from servelab.engines.vllm import VLLM
from servelab.errors import UserError

REGISTRY: dict[str, type[Engine]] = {e.name: e for e in (SGLang, VLLM, Embedded, External, Command)}


def get(name: str) -> Engine:
    """The adapter for an engine name."""
    try:
        return REGISTRY[name]()
    except KeyError:
        raise UserError(f"unknown engine '{name}' (known: {', '.join(names())})") from None


def names() -> list[str]:
    """Every engine name, sorted."""
    return sorted(REGISTRY)
