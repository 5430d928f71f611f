"""HTTP API of the embedded engine, shaped like SGLang's and vLLM's so one client serves all:
OpenAI `/v1/completions` and `/v1/chat/completions` (SSE streaming or not, `usage`,
`stream_options.include_usage`), SGLang `/generate` (cumulative text + `meta_info` with
`spec_verify_ct`), `/v1/models`, `/health`, `/tokenize`, `/detokenize`, `/server_info` (and
its older name `/get_server_info`, the same body), `/metrics` (Prometheus; vLLM metric names),
`/start_profile`, `/stop_profile`: one route module per family (routes/), all reading one
ServerState.

Bodies are validated by protocol.py before they reach the engine: bad requests get a 4xx with an
OpenAI-style error body. A request that still fails inside the engine fails alone (the engine
aborts it and keeps serving); anything unexpected here is a JSON 500, never a plain-text page.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from dataclasses import asdict

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from servelab import __version__
from servelab.errors import UserError
from servelab.mini.engine.args import EngineArgs
from servelab.mini.engine.engine import Engine
from servelab.mini.server.http import error
from servelab.mini.server.pd.allow import BootstrapHosts
from servelab.mini.server.pd.role import PD
from servelab.mini.server.protocol import ApiError
from servelab.mini.server.routes import generate, info, openai, profile, tokens
from servelab.mini.server.state import ServerState


def build_app(engine: Engine, model_name: str, server_args: dict, pd: PD | None = None
              ) -> FastAPI:
    """The FastAPI app around a started engine (`pd`: its disaggregation role, pd/role.py)."""
    app = FastAPI(title="servelab mini", version=__version__)
    state = ServerState(engine, model_name, server_args,
                        pd or PD(engine, "null", "127.0.0.1", 0, 0.0))

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return error(exc.status, exc.message, exc.kind, exc.param)

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        # a bug of ours, not of the request: JSON like every other answer, and the engine serves on
        return error(500, f"internal error: {type(exc).__name__}: {str(exc)[:200]}",
                     "server_error")

    for family in (openai, generate, tokens, info, profile):
        app.include_router(family.routes(state))
    return app


def run_server(args: EngineArgs, host: str, port: int, model_name: str | None = None,
               log_level: str = "warning", bootstrap_port: int = 8998,
               waiting_timeout_s: float = 300.0,
               allowed_bootstrap_hosts: list[str] | None = None) -> None:
    """Load the model, warm it up, serve until SIGINT/SIGTERM, then stop the engine. A prefill
    server (args.disaggregation_mode) also serves its bootstrap port; a decode server waits up
    to `waiting_timeout_s` for each request's KV, fetched only from loopback, this machine and
    `allowed_bootstrap_hosts` (pd/allow.py)."""
    with socket.socket() as s:
        # as uvicorn binds: SO_REUSEADDR, so TIME_WAIT leftovers of a previous server on this
        # port (an experiment runner restarting us) do not count as busy
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except socket.gaierror as exc:
            raise UserError(f"cannot listen on {host}:{port} ({exc.strerror}); check --host"
                            ) from exc
        except OSError as exc:
            raise UserError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another "
                            "--port") from exc
    t0 = time.perf_counter()
    engine = Engine(args)
    engine.warmup()
    engine.start()
    pd = PD(engine, args.disaggregation_mode, host, bootstrap_port, waiting_timeout_s,
            allowed=BootstrapHosts.of(allowed_bootstrap_hosts or []))
    try:
        pd.start()
    except OSError as exc:
        engine.stop()
        raise UserError(f"cannot listen on {host}:{bootstrap_port} for the KV bootstrap "
                        f"({exc.strerror}); pick another --disaggregation-bootstrap-port"
                        ) from exc
    name = model_name or f"servelab-mini-{args.config}"
    app = build_app(engine, name, {**asdict(args), "host": host, "port": port,
                                   "served_model_name": name}, pd)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                           timeout_graceful_shutdown=3, access_log=False))

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.01)
        if server.started:
            spec = (f"{args.speculative_algorithm} steps={args.speculative_num_steps}"
                    if args.speculative_algorithm else "off")
            print(f"servelab mini ready: http://{host}:{port} model={name} "
                  f"weights={engine.weights_meta.get('weights')} device={args.device} "
                  f"spec={spec} slots={args.max_running_requests} "
                  f"disaggregation={args.disaggregation_mode} "
                  f"startup_s={time.perf_counter() - t0:.1f}", flush=True)

    def _exit(*_: object) -> None:
        raise SystemExit(0)

    # uvicorn handles SIGINT/SIGTERM itself (graceful shutdown), then re-raises the signal
    # under the previous handler: ours turns that into a normal exit so the engine is stopped.
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    threading.Thread(target=announce, daemon=True).start()
    try:
        server.run()
    except SystemExit as exc:  # from _exit after uvicorn's graceful shutdown: a normal stop
        if exc.code not in (0, None):  # uvicorn's own sys.exit(1): it could not bind the port
            raise UserError(f"cannot serve on {host}:{port} (see the error above); pick "
                            "another --port") from None
    finally:
        pd.stop()
        engine.stop()
        print("servelab mini stopped", file=sys.stderr, flush=True)
