"""SGLang's `/start_profile` and `/stop_profile`: a torch.profiler trace of engine steps, carried
out by the engine thread (engine/profiler.py); a refused command is a 400 with its reason."""

from __future__ import annotations

import os

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from servelab.mini.server.http import read_body
from servelab.mini.server.protocol import StartProfileRequest, parse
from servelab.mini.server.state import ServerState


def routes(state: ServerState) -> APIRouter:
    """The profiling routes of the server `state` describes."""
    api = APIRouter()
    engine = state.engine

    @api.post("/start_profile")
    async def start_profile(request: Request) -> Response:
        r = parse(StartProfileRequest, await read_body(request))
        out = r.output_dir or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        steps = r.num_steps
        acts = r.activities or ["CPU", "GPU"]
        res = await run_in_threadpool(lambda: engine.profiler.request(
            "start", engine.wake, output_dir=str(out), num_steps=steps, activities=list(acts)))
        return JSONResponse(res, status_code=400 if "error" in res else 200)

    @api.post("/stop_profile")
    async def stop_profile() -> Response:
        res = await run_in_threadpool(lambda: engine.profiler.request("stop", engine.wake))
        return JSONResponse(res, status_code=400 if "error" in res else 200)

    return api
