"""An engine servelab does not start: a URL that is already serving (no launch, no restart)."""

from __future__ import annotations

from collections.abc import Mapping

from servelab.engines.base import Engine, ProcessConfig, ProcessPlan


class External(Engine):
    """A running OpenAI-compatible server at the experiment's `url`; arms cannot change flags."""

    name = "external"
    launches = False
    known_flags = frozenset()

    def command(  # a whole command line of the user's: no launcher prefix
        self, proc: ProcessConfig, model: str, peers: Mapping[str, ProcessPlan]
    ) -> list[str]:
        return []
