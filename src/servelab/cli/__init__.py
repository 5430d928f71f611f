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
        app()
    except UserError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.secho("interrupted", err=True)
        sys.exit(130)
