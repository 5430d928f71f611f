"""The `servelab` command line: one Typer app; each verb lives in its own module of this package.

Verb modules are thin: they build a typed config and call into the library. Each exposes
`register(app)`. Heavy imports (torch, triton, aiohttp) happen inside the verbs, so `servelab --help`
stays fast.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import typer

from servelab import __version__
from servelab.errors import UserError

try:  # recent Typer releases vendor click; older ones use the click package
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover - depends on the installed Typer
    from click import exceptions as _click_exc
_ABORT = getattr(_click_exc, "Abort", KeyboardInterrupt)  # the vendored click has no Abort

app = typer.Typer(
    name="servelab",
    help="A laboratory for methodical LLM-serving optimization: measure, attribute, bound, tune.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# One module per group of verbs, in the order of the measure -> attribute -> bound -> tune loop.
VERB_MODULES = ("bench", "results", "serve", "router", "experiment", "status", "profile", "tune")


DEBUG_ENV = "SERVELAB_DEBUG"


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"servelab {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
    debug: bool = typer.Option(
        False, "--debug", help=f"Show the traceback of any error (also: {DEBUG_ENV}=1); "
        "accepted anywhere on the command line."
    ),
) -> None:
    """servelab: measure, attribute, bound, tune."""


for _name in VERB_MODULES:
    importlib.import_module(f"servelab.cli.{_name}").register(app)


def _say_error(message: str) -> None:
    """The one-line error every failure ends in: literal (no markup, controls escaped)."""
    from servelab.console import literal

    typer.secho(f"error: {literal(message)}", err=True, fg=typer.colors.RED)


def _strip_debug(argv: list[str]) -> tuple[list[str], bool]:
    """`--debug` anywhere before a `--` separator, or SERVELAB_DEBUG set to a true value."""
    cut = argv.index("--") if "--" in argv else len(argv)
    debug = "--debug" in argv[:cut]
    rest = [a for a in argv[:cut] if a != "--debug"] + argv[cut:]
    env = os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")
    return rest, debug or env


def _describe(exc: BaseException) -> tuple[str, int]:
    """(one-line message, exit status) for an exception that is not a UserError."""
    import sqlite3

    if isinstance(exc, UnicodeDecodeError):
        return (f"an input is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                "give a text file (is it binary or in another encoding?)", 2)
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or exc}{where}; check the path and its permissions", 2
    if isinstance(exc, sqlite3.DatabaseError):
        return (f"the results store is damaged ({exc}); move it aside and start a new one, or "
                "salvage it with `sqlite3 results.db .recover | sqlite3 new.db`", 2)
    if isinstance(exc, MemoryError):
        return "out of memory; lower the size of what was asked for", 1
    text = " ".join(str(exc).split())[:300]
    return (f"internal error: {type(exc).__name__}: {text} (a bug in servelab; rerun with "
            f"--debug or {DEBUG_ENV}=1 for the traceback and report it)", 1)


def main() -> None:
    """Console entry point and the CLI's one error policy: a user error is one line on stderr
    (exit 2; 1 for a failure that is not the user's), never a traceback unless --debug or
    SERVELAB_DEBUG=1 asks for it; Ctrl-C exits 130."""
    argv, debug = _strip_debug(sys.argv[1:])
    try:
        rc = app(args=argv, prog_name="servelab", standalone_mode=False)
    except _click_exc.ClickException as exc:  # bad flag or value: one line, like every input error
        msg = exc.format_message()
        if msg:  # NoArgsIsHelp (bare `servelab`, `servelab results`) has printed help: no line
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx else ""
            _say_error(f"{msg}{hint}")
        sys.exit(exc.exit_code)
    except UserError as exc:
        if debug:
            traceback.print_exc()
        _say_error(str(exc))
        sys.exit(2)
    except (_ABORT, KeyboardInterrupt):
        typer.secho("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the policy: nothing else reaches a user as a traceback
        if debug:
            traceback.print_exc()
        msg, code = _describe(exc)
        _say_error(msg)
        sys.exit(code)
    # like click's standalone mode, always end with SystemExit; typer.Exit(code) comes back as rc
    sys.exit(rc if isinstance(rc, int) else 0)
