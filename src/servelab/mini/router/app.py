"""A minimal prefill/decode router with sglang_router's PD protocol (`servelab router`).

Each generation request (`/v1/completions`, `/v1/chat/completions`, `/generate`, streaming or
not) goes to one prefill and one decode server, picked by the policy (round_robin or random),
with SGLang's three fields added to the JSON body: `bootstrap_host` (the prefill URL's host),
`bootstrap_port` (the port given after its URL, or null) and `bootstrap_room` (a random
integer in [0, 2^63), as sglang_router draws it). Both are sent at once; the prefill's answer
is awaited (its failure is the request's answer), then the decode server's answer is passed
through byte for byte, so SSE streams reach the client as the decode server writes them
(proxy.py).

The router's own endpoints (status.py): `/health` (200 only when every worker's /health is and
each reports the role it is routed as), `/metrics` (its own counters, then each decode worker's
series labelled `worker`), `/server_info` and `/get_server_info` (the first decode worker's,
plus the PD layout). Other read-only paths a benchmark uses (`/v1/models`, `/tokenize`,
`/detokenize`) go to a decode worker.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time

import aiohttp
from aiohttp import web

from servelab.errors import UserError
from servelab.mini.router import proxy, status
from servelab.mini.router.args import RouterConfig
from servelab.mini.router.state import RouterState
from servelab.redaction import redact_url

MAX_BODY_BYTES = 64 << 20


def build_app(cfg: RouterConfig) -> web.Application:
    """The aiohttp app of the router: its routes share one RouterState, whose client session
    to the workers lives as long as the app runs."""
    state = RouterState(cfg)
    app = web.Application(client_max_size=MAX_BODY_BYTES)

    async def on_startup(_app: web.Application) -> None:
        state.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=cfg.request_timeout_s))

    async def on_cleanup(_app: web.Application) -> None:
        await state.s.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    proxy.add_routes(app, state)
    status.add_routes(app, state)
    return app


def run_router(cfg: RouterConfig, host: str, port: int) -> None:
    """Bind (a busy port is a UserError), say ready, serve until SIGINT/SIGTERM."""
    t0 = time.perf_counter()

    async def main() -> None:
        runner = web.AppRunner(build_app(cfg), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port, reuse_address=True).start()
        except OSError as exc:
            await runner.cleanup()
            fix = "check --host" if isinstance(exc, socket.gaierror) else "pick another --port"
            raise UserError(f"cannot listen on {host}:{port} ({exc.strerror}); {fix}") from exc
        print(f"servelab router ready: http://{host}:{port} prefill="
              f"{','.join(redact_url(p.url) for p in cfg.prefills)} "
              f"decode={','.join(redact_url(d) for d in cfg.decodes)} "
              f"policy={cfg.policy} startup_s={time.perf_counter() - t0:.1f}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
