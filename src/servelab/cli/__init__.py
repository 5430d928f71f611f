"""The `servelab` command line: one Typer app; each verb lives in its own module of this package.

Verb modules are thin: they build a typed config and call into the library. Each exposes
`register(app)`. Heavy imports (torch, triton, aiohttp) happen inside the verbs, so `servelab --help`
stays fast.
"""

from __future__ import annotations

import importlib
import sys

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
VERB_MODULES = ("bench", "results", "serve", "experiment", "status", "profile", "tune")


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"servelab {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    """servelab: measure, attribute, bound, tune."""


for _name in VERB_MODULES:
    importlib.import_module(f"servelab.cli.{_name}").register(app)


def main() -> None:
    """Console entry point: user errors become one line on stderr and exit status 2."""
    try:
        rc = app(standalone_mode=False)
    except _click_exc.ClickException as exc:  # bad flag or value: one line, like every input error
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx else ""
        typer.secho(f"error: {exc.format_message()}{hint}", err=True, fg=typer.colors.RED)
        sys.exit(exc.exit_code)
    except UserError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        sys.exit(2)
    except (_ABORT, KeyboardInterrupt):
        typer.secho("interrupted", err=True)
        sys.exit(130)
    # like click's standalone mode, always end with SystemExit; typer.Exit(code) comes back as rc
    sys.exit(rc if isinstance(rc, int) else 0)
