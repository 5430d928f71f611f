"""A loopback LLM server with scripted timings: the ground truth that `servelab bench` is tested
against, and a fast fake engine for experiments.

It speaks the APIs real engines speak, with no model behind them:

- `POST /v1/completions`, `POST /v1/chat/completions`: OpenAI-compatible, SSE streaming or not,
  `usage` (streamed when `stream_options.include_usage`), honouring `max_tokens` (or
  `max_completion_tokens`), `ignore_eos` and `min_tokens`.
- `POST /generate`: SGLang native; streamed `data:` lines carry cumulative `text` and `meta_info`
  (`prompt_tokens`, `completion_tokens`, `spec_verify_ct`, `finish_reason`).
- `GET /v1/models`, `GET /health`, `POST /tokenize` (`{"prompt"}` -> `{"tokens", "count"}`; one
  token per whitespace-separated word, equal words equal ids), `GET /metrics` (Prometheus text:
  running and queued requests, generated tokens, vLLM `spec_decode_*` counters or SGLang
  `spec_accept_length` gauges, in the flavour's names), `GET /get_server_info` (sglang flavour).
- Test hooks: `GET /_scripted/log` (per-request server-side record: arrival and the send time of
  every chunk, `time.perf_counter_ns()`, i.e. CLOCK_MONOTONIC, the same clock in every process of
  the host) and `POST /_scripted/reset`.

Timing and failure modes (what the server does with each request, set by a `Script`) are
described in servelab.bench.scripted.script.

Command line (stable; the experiment runner uses it as a fake engine; __main__.py)::

    python -m servelab.bench.scripted --host 127.0.0.1 --port P \
        [--ttft-ms 50] [--gap-ms 10] [--tokens-per-chunk 1] [--natural-len N] \
        [--fail-rate 0] [--fail-modes http500] [--stall-s 3600] [--seed 0] \
        [--model scripted-model] [--flavor vllm|sglang] [--no-tokenize] [--no-metrics] \
        [--no-log] [--default-max-tokens 16] [--api-key KEY] [--max-running C]
        [--gap-per-running-ms K] [--cache-block B] [--echo]

With `--cache-block B` it keeps a prefix cache (whole blocks of B tokens, never evicted) and
reports the prompt tokens it found there as vLLM and SGLang do: `usage.prompt_tokens_details.
cached_tokens` (left out when 0, as vLLM does) and `meta_info.cached_tokens` on /generate.

With `--echo` the log keeps every prompt (chat: the messages) as received, and each request's
answer is a word of its own repeated (` w7 w7 ...` for request 7), so that what a multi-turn
client sent back can be checked against what it was answered.

It prints one line `scripted-server ready http://HOST:PORT` on stdout when it accepts
connections (port 0 picks a free one) and serves until SIGTERM/SIGINT.

From Python (servelab.bench.scripted.harness): `with serve_in_thread(Script(...)) as srv:
srv.url, srv.log()`; in a separate process: `with serve_subprocess(Script(...)) as srv: ...`.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict
from typing import Any

import orjson
from aiohttp import web

from servelab.bench.scripted.script import (
    FAIL_MODES,
    PrefixCache,
    RequestRecord,
    Script,
    Slots,
    count_tokens,
    requested_failure,
    token_ids,
)

__all__ = ["FAIL_MODES", "Script", "ScriptedServer", "count_tokens", "start_server"]


class ScriptedServer:
    """The aiohttp application and its state (counters, request log)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.rng = random.Random(script.seed)
        self.log: list[RequestRecord] = []
        self.n = 0
        self.drafts = 0  # verify steps of multi-token chunks (vLLM counters)
        self.draft_tokens = 0
        self.accepted = 0
        self.tokens_out = 0
        self.steps_out = 0
        self.generated = 0  # every streamed token, the first included (generation_tokens_total)
        self.running = 0
        self.slots = Slots(script.max_running)
        self.cache = PrefixCache(script.cache_block) if script.cache_block else None

    def app(self) -> web.Application:
        key = self.script.api_key

        @web.middleware
        async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
            # /metrics too, as SGLang's --api-key did before it exempted /metrics (vLLM guards
            # only /v1/*): a client that scrapes must send the key
            if key and request.path in ("/v1/completions", "/v1/chat/completions", "/generate",
                                        "/metrics") \
                    and request.headers.get("Authorization") != f"Bearer {key}":
                return web.json_response({"error": "invalid API key"}, status=401)
            return await handler(request)

        app = web.Application(middlewares=[auth])
        r = app.router
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/generate", self.generate)
        r.add_get("/v1/models", self.models)
        r.add_get("/health", self.health)
        if self.script.metrics:
            r.add_get("/metrics", self.metrics)
        if self.script.tokenize:
            r.add_post("/tokenize", self.tokenize)
        if self.script.flavor == "sglang":
            r.add_get("/get_server_info", self.server_info)
        r.add_get("/_scripted/log", self.get_log)
        r.add_post("/_scripted/reset", self.reset)
        return app

    # ---- plain endpoints ---------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.script.model, "object": "model", "owned_by": "servelab", "max_model_len": 1 << 20}
        ]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        text = body.get("prompt") or body.get("text") or ""
        if isinstance(text, list):
            text = " ".join(str(t) for t in text)
        ids = token_ids(text)
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": 1 << 20})

    async def server_info(self, request: web.Request) -> web.Response:
        tau = self.tokens_out / self.steps_out if self.steps_out else None
        return web.json_response({
            "model_path": self.script.model, "scripted": asdict(self.script),
            "speculative_algorithm": "EAGLE" if self.script.tokens_per_chunk > 1 else None,
            "internal_states": [{"avg_spec_accept_length": tau}],
        })

    async def metrics(self, request: web.Request) -> web.Response:
        m, q = self.script.model, self.slots.waiting
        lines = []
        if self.script.flavor == "vllm":
            lines += [
                "# TYPE vllm:num_requests_running gauge",
                f'vllm:num_requests_running{{model_name="{m}"}} {self.running}',
                "# TYPE vllm:num_requests_waiting gauge",
                f'vllm:num_requests_waiting{{model_name="{m}"}} {q}',
                "# TYPE vllm:generation_tokens counter",
                f'vllm:generation_tokens_total{{model_name="{m}"}} {float(self.generated)}',
            ]
            if self.script.tokens_per_chunk > 1:
                for name, v in (("num_drafts", self.drafts), ("num_draft_tokens", self.draft_tokens),
                                ("num_accepted_tokens", self.accepted)):
                    lines += [f"# TYPE vllm:spec_decode_{name} counter",
                              f'vllm:spec_decode_{name}_total{{model_name="{m}"}} {float(v)}']
        else:
            lines += ["# TYPE sglang:num_running_reqs gauge",
                      f'sglang:num_running_reqs{{model_name="{m}"}} {self.running}',
                      "# TYPE sglang:num_queue_reqs gauge",
                      f'sglang:num_queue_reqs{{model_name="{m}"}} {q}',
                      "# TYPE sglang:generation_tokens counter",
                      f'sglang:generation_tokens_total{{model_name="{m}"}} {float(self.generated)}']
            if self.script.tokens_per_chunk > 1 and self.steps_out:
                k = self.script.tokens_per_chunk
                tau = self.tokens_out / self.steps_out
                lines += ["# TYPE sglang:spec_accept_length gauge",
                          f'sglang:spec_accept_length{{model_name="{m}"}} {tau}',
                          "# TYPE sglang:spec_accept_rate gauge",
                          f'sglang:spec_accept_rate{{model_name="{m}"}} {(tau - 1) / (k - 1)}']
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def get_log(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps([asdict(r) for r in self.log]),
                            content_type="application/json")

    async def reset(self, request: web.Request) -> web.Response:
        self.log.clear()
        return web.json_response({"ok": True})

    # ---- generation --------------------------------------------------------------------------

    def _plan(self, path: str, prompt: str, max_tokens: int | None, ignore_eos: bool,
              min_tokens: int, stream: bool, text: object = None) -> RequestRecord:
        now = time.perf_counter_ns()
        s = self.script
        self.n += 1
        mt = s.default_max_tokens if max_tokens is None else max(int(max_tokens), 0)
        n_out = mt
        if s.natural_len is not None and not ignore_eos:
            n_out = min(mt, max(s.natural_len, min_tokens))
        fail = requested_failure(prompt)
        if fail is None and s.fail_rate > 0 and self.rng.random() < s.fail_rate:
            fail = s.fail_modes[(self.n - 1) % len(s.fail_modes)]
        req = RequestRecord(id=f"scripted-{self.n}", path=path, stream=stream, arrival_ns=now,
                   prompt_tokens=count_tokens(prompt), max_tokens=mt, completion_tokens=n_out,
                   fail=fail,
                   cached_tokens=self.cache.lookup_insert(token_ids(prompt)) if self.cache else None)
        if s.echo:
            req.word, req.text = f" w{self.n}", text
        if s.record_log:
            self.log.append(req)
        return req

    def _chunks(self, n_out: int) -> list[int]:
        """Tokens per streamed chunk: 1 from prefill, then one chunk of `tokens_per_chunk` per
        verify step (the last one cut short by max_tokens), as speculative decoding streams."""
        if n_out <= 0:
            return []
        k = self.script.tokens_per_chunk
        return [1] + [min(k, n_out - i) for i in range(1, n_out, k)]

    def _account(self, chunks: list[int]) -> None:
        k = self.script.tokens_per_chunk
        steps = chunks[1:]
        self.generated += sum(chunks)
        self.tokens_out += sum(steps)
        self.steps_out += len(steps)
        if k > 1:
            self.drafts += len(steps)
            self.draft_tokens += len(steps) * (k - 1)
            self.accepted += sum(c - 1 for c in steps)

    async def _http_fail(self, req: RequestRecord) -> web.Response | None:
        if req.fail and req.fail.startswith("http"):
            await asyncio.sleep(self.script.ttft_ms / 1e3)
            code = int(req.fail[4:])
            return web.json_response({"object": "error", "message": f"scripted failure {code}",
                                      "code": code}, status=code)
        return None

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = await request.json()
        if chat:
            msgs = body.get("messages") or []
            prompt = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
        else:
            prompt = body.get("prompt") or ""
            if isinstance(prompt, list):
                prompt = " ".join(str(p) for p in prompt)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        stream = bool(body.get("stream", False))
        req = self._plan(request.path, prompt, max_tokens, bool(body.get("ignore_eos", False)),
                         int(body.get("min_tokens") or 0), stream,
                         body.get("messages") if chat else body.get("prompt"))
        err = await self._http_fail(req)
        if err is not None:
            return err
        chunks = self._chunks(req.completion_tokens)
        usage: dict[str, Any] = {"prompt_tokens": req.prompt_tokens,
                                 "completion_tokens": req.completion_tokens,
                                 "total_tokens": req.prompt_tokens + req.completion_tokens}
        if req.cached_tokens:  # as vLLM: left out when nothing was cached
            usage["prompt_tokens_details"] = {"cached_tokens": req.cached_tokens}
        finish = "length" if req.completion_tokens >= req.max_tokens else "stop"
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        if not stream:
            await self._serve_silently(req, len(chunks))
            text = req.word * req.completion_tokens
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            self._account(chunks)
            req.send_ns.append(time.perf_counter_ns())
            req.chunk_tokens.append(req.completion_tokens)
            return web.json_response({"id": req.id, "object": obj, "created": created,
                                      "model": self.script.model, "choices": [choice], "usage": usage})

        def event(piece: str | None, fin: str | None) -> bytes:
            if chat:
                delta = {"content": piece} if piece is not None else {"role": "assistant", "content": ""}
                ch: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": fin}
            else:
                ch = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": fin}
            return b"data: " + orjson.dumps({"id": req.id, "object": obj + ".chunk" if chat else obj,
                                             "created": created, "model": self.script.model,
                                             "choices": [ch]}) + b"\n\n"

        tail = b""
        so = body.get("stream_options") or {}
        if so.get("include_usage"):
            tail = b"data: " + orjson.dumps({"id": req.id, "object": obj, "created": created,
                                             "model": self.script.model, "choices": [],
                                             "usage": usage}) + b"\n\n"
        lead = event(None, None) if chat else b""  # vLLM sends the role first, with no content
        events = [event(req.word * c, finish if i == len(chunks) - 1 else None)
                  for i, c in enumerate(chunks)]
        return await self._stream(request, req, chunks, lead, events, tail)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body.get("text") or ""
        if isinstance(prompt, list):
            prompt = " ".join(str(p) for p in prompt)
        sp = body.get("sampling_params") or {}
        stream = bool(body.get("stream", False))
        req = self._plan(request.path, prompt, sp.get("max_new_tokens"), bool(sp.get("ignore_eos", False)),
                         int(sp.get("min_new_tokens") or 0), stream, body.get("text"))
        err = await self._http_fail(req)
        if err is not None:
            return err
        chunks = self._chunks(req.completion_tokens)
        spec = self.script.tokens_per_chunk > 1

        def payload(i: int) -> dict[str, Any]:
            done = sum(chunks[: i + 1])
            last = i == len(chunks) - 1
            meta: dict[str, Any] = {
                "id": req.id, "prompt_tokens": req.prompt_tokens, "completion_tokens": done,
                "cached_tokens": req.cached_tokens or 0,
                "finish_reason": ({"type": "length", "length": done} if last and done >= req.max_tokens
                                  else {"type": "stop", "matched": None} if last else None),
            }
            if spec:
                meta["spec_verify_ct"] = i  # verify steps so far; chunk 0 came from prefill
            return {"text": req.word * done, "meta_info": meta, "index": 0}

        if not stream:
            await self._serve_silently(req, len(chunks))
            self._account(chunks)
            req.send_ns.append(time.perf_counter_ns())
            req.chunk_tokens.append(req.completion_tokens)
            return web.json_response(payload(len(chunks) - 1) if chunks else
                                     {"text": "", "meta_info": {"id": req.id, "completion_tokens": 0}})
        events = [b"data: " + orjson.dumps(payload(i)) + b"\n\n" for i in range(len(chunks))]
        return await self._stream(request, req, chunks, b"", events, b"")

    async def _admit(self, req: RequestRecord) -> float:
        """Wait for a slot (the load law); the first chunk's due time (ns): ttft after admission
        (after arrival when there was no wait, so the law off changes nothing)."""
        waited = await self.slots.acquire()
        req.admit_ns = time.perf_counter_ns() if waited else req.arrival_ns
        return req.admit_ns + self.script.ttft_ms * 1e6

    def _next_due(self, due: float) -> float:
        """The next chunk's due time: one decode step at the current batch size later."""
        return due + self.script.step_ms(self.slots.busy) * 1e6

    @staticmethod
    async def _sleep_to(due: float) -> None:
        delay = (due - time.perf_counter_ns()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)

    async def _serve_silently(self, req: RequestRecord, n_chunks: int) -> None:
        """A non-streamed request: hold a slot for the time its chunks would take."""
        due = await self._admit(req)
        try:
            await self._sleep_to(due)
            for _ in range(n_chunks - 1):
                due = self._next_due(due)
                await self._sleep_to(due)
        finally:
            self.slots.release()

    async def _stream(self, request: web.Request, req: RequestRecord, chunks: list[int], lead: bytes,
                      events: list[bytes], tail: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        due = await self._admit(req)
        self.running += 1
        try:
            if lead:
                await resp.write(lead)
            fail = req.fail
            cut_at = len(events) // 2  # failures strike mid-stream
            for i, ev in enumerate(events):
                if fail is not None and i == cut_at:
                    if fail == "malformed":
                        await resp.write(b"data: {\"choices\": [ {broken json\n\n")
                    elif fail == "error_event":  # as vLLM reports an engine error mid-stream
                        await resp.write(b'data: {"error": {"message": "scripted engine error", '
                                         b'"type": "InternalServerError", "code": 500}}\n\n')
                        await resp.write(b"data: [DONE]\n\n")
                        await resp.write_eof()
                        return resp
                    elif fail == "cut":
                        assert request.transport is not None
                        request.transport.abort()
                        return resp
                    elif fail == "stall":
                        await asyncio.sleep(self.script.stall_s)
                if i > 0:
                    due = self._next_due(due)
                if i == 0 or self.script.step_ms(self.slots.busy) > 0:
                    await self._sleep_to(due)
                else:
                    await asyncio.sleep(0)  # zero delay, but each chunk its own write
                await resp.write(ev)
                req.send_ns.append(time.perf_counter_ns())
                req.chunk_tokens.append(chunks[i])
            self._account(chunks)
            if tail:
                await resp.write(tail)
            if fail != "no_done":
                await resp.write(b"data: [DONE]\n\n")
            req.done_ns = time.perf_counter_ns()
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.running -= 1
            self.slots.release()
        return resp


# ---- running it ------------------------------------------------------------------------------


async def start_server(script: Script, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(ScriptedServer(script).app(), access_log=None,
                           handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    await site.start()
    sock = site._server.sockets[0]  # type: ignore[union-attr]
    return runner, sock.getsockname()[1]
