"""The one way servelab prints text: literal, never interpreted by Rich or by the terminal.

Model ids, labels, error messages, kernel names and file paths come from servers, files, traces
and users. Printed through Rich markup, `[/x]` raises MarkupError and `cutlass_gemm[tile]_kernel`
loses `[tile]`; printed raw, `\\x1b]0;pwned\\x07\\x1b[2J` retitles and clears the terminal. So
every console made here has markup, highlighting and emoji codes off, and escapes control
characters (C0 except newline and tab, DEL, C1, and the bidirectional overrides that reorder
what a reader sees) as visible `\\x1b`-style escapes: in every string it lays out (cells,
titles, printed strings), and once more in the final output as a net for Text objects built
elsewhere. Styling is asked for with `style=` (or a Text), never with markup in a string.

Outside the CLI too: presentation helpers below `cli/` (e.g. profile/ceiling_report.py) print
through this module, so nothing depends on the CLI package.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.segment import Segment
from rich.text import Text

PIPE_WIDTH = 160

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROL_KEEP_LINES = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")
_CONTROL_ALL = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def literal(text: Any, *, keep_newlines: bool = False) -> str:
    """`text` as a string safe for a terminal: control and bidi characters escaped. With
    `keep_newlines`, newlines and tabs stay (multi-line output of our own)."""
    s = text if isinstance(text, str) else str(text)
    return (_CONTROL_KEEP_LINES if keep_newlines else _CONTROL_ALL).sub(_escape, s)


class LiteralConsole(Console):
    """A Rich console that shows strings exactly as they are (see the module docstring)."""

    def render_str(self, text: str, *, style: Any = "", justify: Any = None,
                   overflow: Any = None, **_ignored: Any) -> Text:
        """Every str Rich lays out (print arguments, table cells, titles) comes here: no markup,
        no highlighting, controls escaped before widths are measured."""
        return Text(literal(text, keep_newlines=True), style=style or "", justify=justify,
                    overflow=overflow)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        # the net: Text objects made by other code skip render_str; their controls go out escaped
        safe = (Segment(literal(s.text, keep_newlines=True), s.style, s.control)
                if not s.control else s for s in buffer)
        return super()._render_buffer(safe)


def make_console(**kwargs: Any) -> LiteralConsole:
    """The console for CLI output: the terminal's width on a terminal; 160 columns when output
    goes to a file or a CI log (Rich would use 80 and fold every table cell into several lines).
    `kwargs` go to rich.console.Console."""
    if "width" not in kwargs and not sys.stdout.isatty() and not os.environ.get("COLUMNS"):
        kwargs["width"] = PIPE_WIDTH
    kwargs.update(markup=False, highlight=False, emoji=False)
    return LiteralConsole(**kwargs)


_JSON_UNSAFE = re.compile(f"[\x7f-\x9f{_BIDI}]")


def json_text(doc: str) -> str:
    """JSON text for a terminal: the C0 controls are already escaped by any JSON encoder; DEL,
    C1 and the bidi overrides are escaped too (`\\u009b`), still valid JSON, same value."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", doc)
