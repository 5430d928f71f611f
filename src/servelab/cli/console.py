"""The CLI's console: servelab.console (literal text, no markup), re-exported for the verbs."""

from __future__ import annotations

from servelab.console import PIPE_WIDTH, literal, make_console

__all__ = ["PIPE_WIDTH", "literal", "make_console"]
