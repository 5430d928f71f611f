"""The CLI's Rich console: the terminal's width on a terminal; 160 columns when output goes to a
file or a CI log (Rich would use 80 and fold every table cell into several lines)."""

from __future__ import annotations

import os
import sys

from rich.console import Console

PIPE_WIDTH = 160


def make_console(**kwargs) -> Console:
    """A Console for CLI output; `kwargs` go to rich.console.Console."""
    if "width" not in kwargs and not sys.stdout.isatty() and not os.environ.get("COLUMNS"):
        kwargs["width"] = PIPE_WIDTH
    return Console(**kwargs)
