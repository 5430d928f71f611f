"""`servelab bench`: its flags (options), the parsed plan, the run, the sweep and what is
printed and written (output)."""

from servelab.cli.bench.command import register

__all__ = ["register"]
