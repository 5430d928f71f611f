"""Any server started by a command line of your own (`command = [...]` in the experiment file):
`{host}` and `{port}` in it are filled in, the flags appended. Flags are not checked."""

from __future__ import annotations

from collections.abc import Mapping

from servelab.engines.base import Engine, ProcessConfig, ProcessPlan, render_flags


class Command(Engine):
    """A generic OpenAI-compatible server: `command` from the file, then `--flag value` pairs."""

    name = "command"
    roles = ("server", "prefill", "decode", "router")
    known_flags = None

    def command(  # a whole command line of the user's: no launcher prefix
        self, proc: ProcessConfig, model: str, peers: Mapping[str, ProcessPlan]
    ) -> list[str]:
        template: list[str] = proc.extra.get("command") or []
        fill = {"host": proc.host, "port": str(proc.port), "model": model}
        for plan in peers.values():
            fill[f"{plan.role}_url"] = plan.url
        return [part.format(**fill) for part in template] + render_flags(proc.flags)
