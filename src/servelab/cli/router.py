"""CLI verb `router`: a minimal prefill/decode router with sglang_router's flags
(`python -m sglang_router.launch_router --pd-disaggregation --prefill URL [BOOTSTRAP_PORT]
--decode URL ...`), so an experiment's PD layout renders the same for SGLang and the embedded
engine. The library side is servelab/mini/router/.

The verb takes its arguments raw: mini/router/args.py parses them (sglang_router's
`--prefill URL [PORT]` is not a shape Typer can declare).
"""

from __future__ import annotations

import typer

from servelab.mini.router.args import parse

HELP = """Route requests over prefill and decode servers (SGLang's PD protocol).

  servelab router --pd-disaggregation --prefill URL [BOOTSTRAP_PORT] --decode URL
                  [--prefill ... --decode ...] [--host H] [--port P]
                  [--policy round_robin|random] [--request-timeout-secs S]
"""


def router(ctx: typer.Context) -> None:
    """Route requests over prefill and decode servers (SGLang's PD protocol); run
    `servelab router --help` for the flags."""
    cfg, host, port = parse(list(ctx.args))
    from servelab.mini.router.app import run_router  # aiohttp: only when routing

    run_router(cfg, host, port)


def register(app: typer.Typer) -> None:
    """Add the `router` verb."""
    app.command("router", help=HELP, context_settings={
        "allow_extra_args": True, "ignore_unknown_options": True})(router)
