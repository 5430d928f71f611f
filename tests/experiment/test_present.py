"""The runner's progress lines are plain text with outside text inside (arm names, a server's
error): printed literally, controls escaped, styled by their first word, never parsed as markup."""

from __future__ import annotations

import io

from servelab.console import make_console
from servelab.experiment.present import printer


def test_outside_text_in_a_progress_line_is_printed_literally_and_styled():
    buf = io.StringIO()
    console = make_console(file=buf, width=200, force_terminal=True, color_system="standard")
    say = printer(console)
    say("failed arm [/x], c=1, rep 1: HTTP 500 cutlass_gemm[tile]_kernel \x1b]0;pwned\x07")
    say("ok arm a, c=1, rep 1: output_throughput_tok_s 100")
    out = buf.getvalue()
    assert "arm [/x], c=1" in out and "cutlass_gemm[tile]_kernel" in out   # nothing eaten
    assert "\x1b]0;" not in out and "\\x1b]0;pwned\\x07" in out           # escape shown, not run
    failed, ok = out.splitlines()
    assert "\x1b[31m" in failed            # red, from the line's first word
    assert "\x1b[3" not in ok              # a plain line gets no colour
