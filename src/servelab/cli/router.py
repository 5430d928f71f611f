"""CLI verb `router`: a minimal prefill/decode router with sglang_router's flags
(`python -m sglang_router.launch_router --pd-disaggregation --prefill URL [BOOTSTRAP_PORT]
--decode URL ...`), so an experiment's PD layout renders the same for SGLang and the embedded
engine. The library side is servelab/mini/router.py.

`--prefill URL [PORT]` takes one or two values, which Typer cannot declare: the verb takes its
arguments raw and parses them with argparse (errors are one line, as everywhere).
"""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit

import typer

from servelab.errors import UserError

HELP = """Route requests over prefill and decode servers (SGLang's PD protocol).

  servelab router --pd-disaggregation --prefill URL [BOOTSTRAP_PORT] --decode URL
                  [--prefill ... --decode ...] [--host H] [--port P]
                  [--policy round_robin|random] [--request-timeout-secs S]
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"servelab router: {message} (see `servelab router --help`)")


def _url(value: str, flag: str) -> str:
    u = urlsplit(value)
    if u.scheme not in ("http", "https") or not u.hostname or u.port is None:
        raise UserError(f"{flag} {value}: give a worker URL such as http://127.0.0.1:30000")
    return value.rstrip("/")


def _port(value: str, flag: str) -> int | None:
    if value.lower() == "none":
        return None
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise UserError(f"{flag} bootstrap port {value!r}: give a port number 1..65535 or none")
    return int(value)


def parse(argv: list[str]):
    """argv -> (RouterConfig, host, port); UserError on anything wrong."""
    from servelab.mini.router import POLICIES, Prefill, RouterConfig

    p = _Parser(prog="servelab router", add_help=False)
    p.add_argument("--pd-disaggregation", action="store_true")
    p.add_argument("--prefill", action="append", nargs="+", default=[])
    p.add_argument("--decode", action="append", nargs=1, default=[])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--policy", default="round_robin")
    p.add_argument("--request-timeout-secs", type=float, default=1800.0)
    p.add_argument("--log-level", default="warning")
    a = p.parse_args(argv)
    if not a.pd_disaggregation:
        raise UserError("servelab router routes prefill/decode deployments only: pass "
                        "--pd-disaggregation (a single server needs no router)")
    if not a.prefill or not a.decode:
        raise UserError("servelab router needs at least one --prefill URL and one --decode URL")
    prefills = []
    for vals in a.prefill:
        if len(vals) > 2:
            raise UserError(f"--prefill {' '.join(vals)}: give URL and at most one bootstrap port")
        url = _url(vals[0], "--prefill")
        prefills.append(Prefill(url, _port(vals[1], "--prefill") if len(vals) == 2 else None))
    decodes = tuple(_url(v[0], "--decode") for v in a.decode)
    if a.policy not in POLICIES:
        raise UserError(f"--policy {a.policy}: this router knows {', '.join(POLICIES)}")
    if not 1 <= a.port <= 65535:
        raise UserError(f"--port {a.port}: must be 1..65535")
    if not a.request_timeout_secs > 0:
        raise UserError(f"--request-timeout-secs {a.request_timeout_secs:g}: must be > 0")
    return (RouterConfig(tuple(prefills), decodes, a.policy, a.request_timeout_secs),
            a.host, a.port)


def router(ctx: typer.Context) -> None:
    """Route requests over prefill and decode servers (SGLang's PD protocol); run
    `servelab router --help` for the flags."""
    cfg, host, port = parse(list(ctx.args))
    from servelab.mini.router import run_router

    run_router(cfg, host, port)


def register(app: typer.Typer) -> None:
    """Add the `router` verb."""
    app.command("router", help=HELP, context_settings={
        "allow_extra_args": True, "ignore_unknown_options": True})(router)
