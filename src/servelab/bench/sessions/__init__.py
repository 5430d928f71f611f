"""Multi-turn sessions on the wire: driver.py sends each session's turns one after the other,
every turn with the history and the server's own earlier answers (the planned turns come from
servelab.bench.datasets.sessions)."""

from servelab.bench.sessions.driver import run_sessions, turn_spec

__all__ = ["run_sessions", "turn_spec"]
