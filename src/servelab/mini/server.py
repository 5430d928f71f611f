"""HTTP API of the embedded engine, shaped like SGLang's and vLLM's so one client serves all:
OpenAI `/v1/completions` and `/v1/chat/completions` (SSE streaming or not, `usage`,
`stream_options.include_usage`), SGLang `/generate` (cumulative text + `meta_info` with
`spec_verify_ct`), `/v1/models`, `/health`, `/tokenize`, `/detokenize`, `/server_info` (and
its older name `/get_server_info`, the same body), `/metrics` (Prometheus; vLLM metric names),
`/start_profile`, `/stop_profile`.

Bodies are validated by protocol.py before they reach the engine: bad requests get a 4xx with an
OpenAI-style error body. A request that still fails inside the engine fails alone (the engine
aborts it and keeps serving); anything unexpected here is a JSON 500, never a plain-text page.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from servelab import __version__
from servelab.errors import UserError
from servelab.mini import tokenizer as tk
from servelab.mini.engine import Engine, EngineArgs, Event
from servelab.mini.metrics import render_metrics
from servelab.mini.pd_server import PD
from servelab.mini.protocol import (
    MAX_BODY_BYTES,
    ApiError,
    DetokenizeRequest,
    StartProfileRequest,
    TokenizeRequest,
    parse,
    parse_chat,
    parse_completion,
    parse_generate,
)


def _error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": status}}, status_code=status)


async def _body(request: Request) -> dict:
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
        raise ApiError(413, f"request body of {int(size):,} bytes is larger than the "
                            f"{MAX_BODY_BYTES:,} this server accepts")
    raw = bytearray()
    async for chunk in request.stream():  # bounded even without (or with a lying) Content-Length
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise ApiError(413, f"request body is larger than the {MAX_BODY_BYTES:,} bytes this "
                                "server accepts")
    try:
        body = json.loads(raw) if raw else {}
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, huge ints, nesting
        msg = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise ApiError(400, f"request body is not valid JSON: {msg}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def _sse(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class _Stream:
    """Engine events of one request, delivered into the event loop; `on_error` hears why the
    engine failed it, or that it was aborted (a prefill server passes it on to the request's
    decode side, which would otherwise wait out its timeout for KV that never comes)."""

    def __init__(self, engine: Engine, prompt: list[int], params,
                 on_error: Callable[[str], None] | None = None, **submit_kw) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.engine = engine
        self.on_error = on_error
        try:
            self.rid = engine.submit(prompt, params, self._put, **submit_kw)
        except UserError as exc:
            raise ApiError(400, str(exc)) from None
        self.done = False

    def _put(self, ev: Event) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ev)

    async def events(self) -> AsyncIterator[Event]:
        try:
            while True:
                ev = await self.queue.get()
                if ev.finish_reason == "error" and self.on_error is not None:
                    self.on_error(ev.error or "the engine failed the request")
                yield ev
                if ev.finish_reason is not None:
                    self.done = True
                    return
        finally:
            if not self.done:  # client went away: free the slot
                self.engine.abort(self.rid)
                if self.on_error is not None:  # a prefill's decode side must not wait for it
                    self.on_error("the request was aborted before it finished (its client "
                                  "went away)")

    async def collect(self) -> tuple[str, Event]:
        """Wait for the whole answer (non-streaming): (all text, the final event)."""
        text, last = [], None
        async for ev in self.events():
            text.append(ev.text)
            last = ev
        return "".join(text), last


def build_app(engine: Engine, model_name: str, server_args: dict, pd: PD | None = None
              ) -> FastAPI:
    """The FastAPI app around a started engine (`pd`: its disaggregation role, pd_server.py)."""
    app = FastAPI(title="servelab mini", version=__version__)
    pd = pd or PD(engine, "null", "127.0.0.1", 0, 0.0)
    names = {model_name, engine.cfg.name}

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.kind, exc.param)

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        # a bug of ours, not of the request: JSON like every other answer, and the engine serves on
        return _error(500, f"internal error: {type(exc).__name__}: {str(exc)[:200]}",
                      "server_error")

    def failed_message(ev: Event) -> str:
        return (f"the engine failed on this request ({ev.error or 'unknown error'}); it was "
                "aborted and the server keeps serving")

    def failed(ev: Event) -> JSONResponse:
        return _error(500, failed_message(ev), "server_error")

    def stream_error(ev: Event) -> dict:
        return {"error": {"message": failed_message(ev), "type": "server_error", "param": None,
                          "code": 500}}

    def check_model(body: dict) -> None:
        m = body.get("model")
        if m is not None and not isinstance(m, str):
            raise ApiError(400, f"'model' must be a string, got {type(m).__name__}",
                           param="model")
        if m is not None and m not in names:
            raise ApiError(404, f"model {m!r} does not exist; this server serves {model_name!r}",
                           "model_not_found")

    def usage(ev: Event) -> dict:
        return {"prompt_tokens": ev.prompt_tokens, "completion_tokens": ev.completion_tokens,
                "total_tokens": ev.prompt_tokens + ev.completion_tokens}

    async def open_stream(body: dict, parse_body: Callable[[], tuple]) -> tuple[_Stream, tuple]:
        """Parse a generation request and submit it, through the server's PD role: a prefill
        server records a refusal in the request's room, a decode server waits for its KV."""
        boot = pd.room(body)
        try:
            parsed = parse_body()
            kw = await pd.submit_kwargs(boot, parsed[0])
            return _Stream(engine, parsed[0], parsed[1],
                           on_error=lambda why: pd.failed(boot, why), **kw), parsed
        except ApiError as exc:
            pd.failed(boot, exc.message)
            raise

    async def openai(body: dict, chat: bool) -> Response:
        def parse_body() -> tuple:
            check_model(body)
            return (parse_chat if chat else parse_completion)(body, engine.args.context_length)

        st, (prompt, params, stream, include_usage) = await open_stream(body, parse_body)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        if not stream:
            content, last = await st.collect()
            if last.finish_reason == "error":
                return failed(last)
            choice = ({"index": 0, "message": {"role": "assistant", "content": content},
                       "finish_reason": last.finish_reason} if chat else
                      {"index": 0, "text": content, "logprobs": None,
                       "finish_reason": last.finish_reason})
            return JSONResponse({"id": rid, "object": obj, "created": created,
                                 "model": model_name, "choices": [choice],
                                 "usage": usage(last)})

        chunk_obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str | None, finish: str | None, first: bool = False) -> dict:
            if chat:
                delta = {"role": "assistant", "content": ""} if first else (
                    {"content": text} if text else {})
                ch = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                ch = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            return {"id": rid, "object": chunk_obj, "created": created, "model": model_name,
                    "choices": [ch]}

        async def gen() -> AsyncIterator[bytes]:
            if chat:
                yield _sse(chunk(None, None, first=True))
            last = None
            async for ev in st.events():
                last = ev
                if ev.finish_reason == "error":  # as vLLM: an error object, then [DONE]
                    yield _sse(stream_error(ev))
                    break
                if ev.text or ev.finish_reason is not None:
                    yield _sse(chunk(ev.text, ev.finish_reason))
            if include_usage and last is not None:
                yield _sse({"id": rid, "object": chunk_obj, "created": created,
                            "model": model_name, "choices": [], "usage": usage(last)})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await openai(await _body(request), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await openai(await _body(request), chat=True)

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        body = await _body(request)
        st, (prompt, params, stream) = await open_stream(
            body, lambda: parse_generate(body, engine.args.context_length))
        rid = uuid.uuid4().hex

        def meta(ev: Event) -> dict:
            fr = None
            if ev.finish_reason == "length":
                fr = {"type": "length", "length": ev.completion_tokens}
            elif ev.finish_reason is not None:
                fr = {"type": ev.finish_reason}
            return {"id": rid, "finish_reason": fr, "prompt_tokens": ev.prompt_tokens,
                    "completion_tokens": ev.completion_tokens,
                    "spec_verify_ct": ev.spec_verify_ct}

        if not stream:
            text, last = await st.collect()
            if last.finish_reason == "error":
                return failed(last)
            return JSONResponse({"text": text, "meta_info": meta(last)})

        async def gen() -> AsyncIterator[bytes]:
            text = ""
            async for ev in st.events():
                if ev.finish_reason == "error":
                    yield _sse(stream_error(ev))
                    break
                text += ev.text
                if ev.text or ev.finish_reason is not None:
                    yield _sse({"text": text, "meta_info": meta(ev)})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": 0, "owned_by": "servelab",
            "root": model_name, "max_model_len": engine.args.context_length}]}

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info() -> dict:
        # SGLang's: routers and clients that discover a worker's model read this
        return {"model_path": model_name, "tokenizer_path": None, "is_generation": True,
                "served_model_name": model_name}

    @app.get("/health")
    async def health() -> Response:
        bad = engine.unhealthy()
        if bad is not None:
            return _error(503, f"engine failed: {bad}", "server_error")
        return Response(status_code=200)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        body = await _body(request)
        check_model(body)
        r = parse(TokenizeRequest, body)
        if r.messages is not None:
            ids = tk.apply_chat_template([m.model_dump() for m in r.messages])
        else:
            text = r.prompt if r.prompt is not None else r.text
            if text is None:
                raise ApiError(400, "/tokenize needs 'prompt' (a string) or 'messages'",
                               param="prompt")
            ids = tk.encode(text, add_bos=r.add_special_tokens)
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.args.context_length,
                "token_strs": [tk.token_str(t) for t in ids] if r.return_token_strs else None}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        body = await _body(request)
        ids = parse(DetokenizeRequest, body).tokens
        if not all(0 <= t < engine.cfg.vocab_size for t in ids):
            raise ApiError(400, f"'tokens' must be a list of ints in [0, {engine.cfg.vocab_size})",
                           param="tokens")
        return {"prompt": tk.decode(ids)}

    @app.get("/server_info")
    @app.get("/get_server_info")  # the older name (SGLang < 0.5 and its benches read this one)
    async def server_info() -> dict:
        st = engine.stats
        return {**server_args, **pd.info(), "version": __version__, "engine": "servelab-mini",
                "served_model_name": model_name, "model_config": engine.cfg.to_dict(),
                "weights": engine.weights_meta,
                "internal_states": [{"avg_spec_accept_length": st.avg_spec_accept_length,
                                     "num_running_reqs": engine.num_running,
                                     "num_queue_reqs": engine.num_waiting,
                                     "stats": asdict(st)}]}

    @app.get("/metrics")
    async def metrics() -> Response:
        body, ctype = render_metrics(engine, model_name, pd.stats)
        return Response(body, media_type=ctype)

    @app.post("/start_profile")
    async def start_profile(request: Request) -> Response:
        r = parse(StartProfileRequest, await _body(request))
        out = r.output_dir or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        steps = r.num_steps
        acts = r.activities or ["CPU", "GPU"]
        res = await run_in_threadpool(lambda: engine.profiler.request(
            "start", engine.wake, output_dir=str(out), num_steps=steps, activities=list(acts)))
        return JSONResponse(res, status_code=400 if "error" in res else 200)

    @app.post("/stop_profile")
    async def stop_profile() -> Response:
        res = await run_in_threadpool(lambda: engine.profiler.request("stop", engine.wake))
        return JSONResponse(res, status_code=400 if "error" in res else 200)

    return app


def run_server(args: EngineArgs, host: str, port: int, model_name: str | None = None,
               log_level: str = "warning", bootstrap_port: int = 8998,
               waiting_timeout_s: float = 300.0) -> None:
    """Load the model, warm it up, serve until SIGINT/SIGTERM, then stop the engine. A prefill
    server (args.disaggregation_mode) also serves its bootstrap port; a decode server waits up
    to `waiting_timeout_s` for each request's KV."""
    import signal
    import socket
    import sys
    import threading

    import uvicorn

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
    pd = PD(engine, args.disaggregation_mode, host, bootstrap_port, waiting_timeout_s)
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
