"""The flags of `servelab router`, as sglang_router spells them, parsed into a RouterConfig.

One parser for the command line (cli/router.py) and for the experiment pre-flight
(engines/embedded.py), so `servelab run FILE --check` refuses a router flag the router would.
`--prefill URL [PORT]` takes one or two values, which Typer cannot declare: argparse parses
them, and its errors are one-line UserErrors. Light imports only.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from urllib.parse import urlsplit

from servelab.errors import UserError
from servelab.redaction import redact_url

POLICIES = ("round_robin", "random")
MAX_TIMEOUT_S = 7 * 86400.0  # a week: finite, as aiohttp's timers need


@dataclass(frozen=True, slots=True)
class Prefill:
    """A prefill worker: its URL and the bootstrap port given after it (None: not given)."""

    url: str
    bootstrap_port: int | None


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """The router's workers and policy (validated by `parse`)."""

    prefills: tuple[Prefill, ...]
    decodes: tuple[str, ...]
    policy: str = "round_robin"
    request_timeout_s: float = 1800.0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"servelab router: {message} (see `servelab router --help`)")


def _url(value: str, flag: str) -> str:
    try:  # urlsplit and .port raise ValueError on "http://[::1", "http://a:99999", "http://a:x"
        u = urlsplit(value)
        ok = u.scheme in ("http", "https") and bool(u.hostname) and bool(u.port)
    except ValueError:
        ok = False
    if not ok:
        raise UserError(f"{flag} {redact_url(value)}: give a worker URL such as "
                        "http://127.0.0.1:30000")
    return value.rstrip("/")


def _port(value: str, flag: str) -> int | None:
    if value.lower() == "none":
        return None
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise UserError(f"{flag} bootstrap port {value!r}: give a port number 1..65535 or none")
    return int(value)


def parse(argv: list[str]):
    """argv -> (RouterConfig, host, port); UserError on anything wrong."""
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
    if not 0 < a.request_timeout_secs <= MAX_TIMEOUT_S:  # nan too; inf broke every request
        raise UserError(f"--request-timeout-secs {a.request_timeout_secs:g}: must be > 0 and "
                        f"<= {MAX_TIMEOUT_S:g}")
    return (RouterConfig(tuple(prefills), decodes, a.policy, a.request_timeout_secs),
            a.host, a.port)
