"""What a server says about itself: `/health`, `/get_model_info` and `/model_info` (SGLang's),
`/server_info` and its older name `/get_server_info` (the same body), `/metrics` (Prometheus,
vLLM's metric names)."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter
from fastapi.responses import Response

from servelab import __version__
from servelab.mini.server.http import error
from servelab.mini.server.metrics import render_metrics
from servelab.mini.server.state import ServerState


def routes(state: ServerState) -> APIRouter:
    """The status routes of the server `state` describes."""
    api = APIRouter()
    engine, model_name = state.engine, state.model_name

    @api.get("/get_model_info")
    @api.get("/model_info")
    async def model_info() -> dict:
        # SGLang's: routers and clients that discover a worker's model read this
        return {"model_path": model_name, "tokenizer_path": None, "is_generation": True,
                "served_model_name": model_name}

    @api.get("/health")
    async def health() -> Response:
        bad = engine.unhealthy()
        if bad is not None:
            return error(503, f"engine failed: {bad}", "server_error")
        return Response(status_code=200)

    @api.get("/server_info")
    @api.get("/get_server_info")  # the older name (SGLang < 0.5 and its benches read this one)
    async def server_info() -> dict:
        st = engine.stats
        return {**state.server_args, **state.pd.info(), "version": __version__,
                "engine": "servelab-mini", "served_model_name": model_name,
                "model_config": engine.cfg.to_dict(), "weights": engine.weights_meta,
                "internal_states": [{"avg_spec_accept_length": st.avg_spec_accept_length,
                                     "num_running_reqs": engine.num_running,
                                     "num_queue_reqs": engine.num_waiting,
                                     "stats": asdict(st)}]}

    @api.get("/metrics")
    async def metrics() -> Response:
        body, ctype = render_metrics(engine, model_name, state.pd.stats)
        return Response(body, media_type=ctype)

    return api
