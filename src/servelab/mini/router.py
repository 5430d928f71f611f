"""A minimal prefill/decode router with sglang_router's PD protocol (`servelab router`).

Each generation request (`/v1/completions`, `/v1/chat/completions`, `/generate`, streaming or
not) goes to one prefill and one decode server, picked by the policy (round_robin or random),
with SGLang's three fields added to the JSON body: `bootstrap_host` (the prefill URL's host),
`bootstrap_port` (the port given after its URL, or null) and `bootstrap_room` (a random
integer in [0, 2^63), as sglang_router draws it). Both are sent at once; the prefill's answer
is awaited (its failure is the request's answer), then the decode server's answer is passed
through byte for byte, so SSE streams reach the client as the decode server writes them.

The router's own endpoints: `/health` (200 only when every worker's /health is and each
reports the role it is routed as), `/metrics` (its own counters, then each decode worker's
series labelled `worker`, so a scraper of the endpoint sees the spec-decode and KV-transfer
counters of the servers that decode),
`/server_info` and `/get_server_info` (the first decode worker's, plus the PD layout). Other
read-only paths a benchmark uses (`/v1/models`, `/tokenize`, `/detokenize`) go to a decode
worker.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from servelab.mini.router_args import RouterConfig

GENERATE_PATHS = ("/v1/completions", "/v1/chat/completions", "/generate")
FORWARD_GET = ("/v1/models",)
FORWARD_POST = ("/tokenize", "/detokenize")
MAX_BODY_BYTES = 64 << 20
# After a decode server's failure, how long the router waits for the prefill's answer (whose
# status says better what was wrong) before it answers with the decode's.
PREFILL_GRACE_S = 1.0


@dataclass(slots=True)
class _Counters:
    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    upstream_errors: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0

    def done(self, path: str, status: int) -> None:
        self.requests[(path, status)] = self.requests.get((path, status), 0) + 1


class _Picker:
    def __init__(self, n: int, policy: str) -> None:
        self.n, self.policy = n, policy
        self._next = itertools.cycle(range(n))

    def __call__(self) -> int:
        return random.randrange(self.n) if self.policy == "random" else next(self._next)


def host_of(url: str) -> str:
    """The host part of a worker URL (what sglang_router sends as bootstrap_host)."""
    return urlsplit(url).hostname or "127.0.0.1"


def build_app(cfg: RouterConfig) -> web.Application:
    """The aiohttp app of the router."""
    counters = _Counters()
    pick_p, pick_d = _Picker(len(cfg.prefills), cfg.policy), _Picker(len(cfg.decodes), cfg.policy)
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    state: dict[str, aiohttp.ClientSession] = {}

    async def on_startup(_app: web.Application) -> None:
        state["s"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=cfg.request_timeout_s))

    async def on_cleanup(_app: web.Application) -> None:
        await state["s"].close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)

    def error(status: int, message: str, kind: str = "server_error") -> web.Response:
        return web.json_response({"error": {"message": message, "type": kind,
                                            "param": None, "code": status}}, status=status)

    async def generate(request: web.Request) -> web.StreamResponse:
        path = request.path
        try:
            body = await request.json()
        except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, huge ints, deep nesting
            counters.done(path, 400)
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
            return error(400, f"request body is not valid JSON: {why}", "invalid_request_error")
        if not isinstance(body, dict):
            counters.done(path, 400)
            return error(400, "request body must be a JSON object", "invalid_request_error")
        p, d = cfg.prefills[pick_p()], cfg.decodes[pick_d()]
        body = {**body, "bootstrap_host": host_of(p.url), "bootstrap_port": p.bootstrap_port,
                "bootstrap_room": random.getrandbits(63)}
        s = state["s"]
        counters.in_flight += 1
        try:
            return await _dispatch(request, s, path, body, p.url, d)
        finally:
            counters.in_flight -= 1

    async def _prefill(s: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, bytes, str]:
        async with s.post(url, json=body) as r:
            return r.status, await r.read(), r.content_type

    async def _dispatch(request: web.Request, s: aiohttp.ClientSession, path: str, body: dict,
                        p_url: str, d_url: str) -> web.StreamResponse:
        pf = asyncio.ensure_future(_prefill(s, p_url + path, body))
        try:
            dresp = await s.post(d_url + path, json=body)
        except asyncio.CancelledError:
            pf.cancel()
            raise
        except (aiohttp.ClientError, TimeoutError) as exc:
            pf.cancel()
            counters.upstream_errors["decode"] = counters.upstream_errors.get("decode", 0) + 1
            counters.done(path, 502)
            return error(502, f"decode server {d_url} failed: {type(exc).__name__}: {exc}")
        try:
            try:
                if dresp.status != 200:
                    # decode failed (its KV never came, or the prefill failed it): a prefill that
                    # refused the request answers within moments with the better status; one
                    # that hangs must not hold the request until --request-timeout-secs
                    done, _ = await asyncio.wait({pf}, timeout=PREFILL_GRACE_S)
                    if not done:
                        pf.cancel()
                        counters.done(path, dresp.status)
                        return web.Response(status=dresp.status, body=await dresp.read(),
                                            content_type=dresp.content_type)
                p_status, p_body, p_type = await pf
            except (aiohttp.ClientError, TimeoutError) as exc:
                counters.upstream_errors["prefill"] = counters.upstream_errors.get("prefill", 0) + 1
                counters.done(path, 502)
                return error(502, f"prefill server {p_url} failed: {type(exc).__name__}: {exc}")
            if p_status != 200:  # the request failed before decode could start: say why
                counters.done(path, p_status)
                return web.Response(status=p_status, body=p_body, content_type=p_type)
            out = web.StreamResponse(status=dresp.status)
            out.content_type = dresp.content_type
            if dresp.charset:
                out.charset = dresp.charset
            await out.prepare(request)
            chunks = dresp.content.iter_any()
            while True:
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                except (aiohttp.ClientError, TimeoutError) as exc:  # decode broke off mid-answer
                    counters.upstream_errors["decode"] = counters.upstream_errors.get("decode",
                                                                                      0) + 1
                    counters.done(path, 502)
                    if out.content_type != "text/event-stream":
                        raise  # drop the connection: a cut JSON body must not look complete
                    msg = f"decode server {d_url} broke off: {type(exc).__name__}: {exc}"
                    await out.write(b"data: " + json.dumps({"error": {  # as vLLM ends a failed
                        "message": msg, "type": "server_error", "param": None,  # stream
                        "code": 502}}).encode() + b"\n\ndata: [DONE]\n\n")
                    await out.write_eof()
                    return out
                await out.write(chunk)
            await out.write_eof()
            counters.done(path, dresp.status)
            return out
        finally:
            dresp.release()
            pf.cancel()  # a no-op once the prefill answered

    async def forward(request: web.Request) -> web.Response:
        d = cfg.decodes[pick_d()]
        data = await request.read() if request.method == "POST" else None
        try:
            async with state["s"].request(request.method, d + request.path, data=data,
                                          headers={"Content-Type": "application/json"}) as r:
                return web.Response(status=r.status, body=await r.read(),
                                    content_type=r.content_type)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return error(502, f"decode server {d} failed: {type(exc).__name__}: {exc}")

    async def _get(url: str, timeout_s: float = 5.0) -> tuple[int, bytes] | None:
        try:
            async with state["s"].get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                return r.status, await r.read()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None

    async def health(_request: web.Request) -> web.Response:
        roles = [(p.url, "prefill") for p in cfg.prefills] + [(d, "decode") for d in cfg.decodes]
        got = await asyncio.gather(*(_get(u + "/health", 2.0) for u, _ in roles))
        bad = [u for (u, _), g in zip(roles, got, strict=True) if g is None or g[0] != 200]
        if bad:
            return error(503, f"worker(s) not healthy: {', '.join(bad)}")
        # a worker named in the wrong role (a prefill given as --decode) would answer every
        # request with one token: refuse to be healthy, naming it
        infos = await asyncio.gather(*(_get(u + "/server_info", 2.0) for u, _ in roles))
        wrong = [f"{u} runs --disaggregation-mode {mode}, routed as {role}"
                 for (u, role), g in zip(roles, infos, strict=True)
                 if (mode := _mode(g)) is not None and mode != role]
        if wrong:
            return error(503, f"worker(s) in the wrong role: {'; '.join(wrong)}")
        return web.Response(status=200)

    async def server_info(_request: web.Request) -> web.Response:
        got = await _get(cfg.decodes[0] + "/server_info")
        if got is None or got[0] != 200:
            got = await _get(cfg.decodes[0] + "/get_server_info")
        info: dict = {}
        if got is not None and got[0] == 200:
            try:
                info = json.loads(got[1])
            except ValueError:
                info = {}
        info = info if isinstance(info, dict) else {"value": info}
        info["router"] = {"pd_disaggregation": True, "policy": cfg.policy,
                          "prefill": [[p.url, p.bootstrap_port] for p in cfg.prefills],
                          "decode": list(cfg.decodes)}
        return web.json_response(info)

    async def metrics(_request: web.Request) -> web.Response:
        texts = await asyncio.gather(*(_get(d + "/metrics") for d in cfg.decodes))
        reg = CollectorRegistry(auto_describe=False)
        reg.register(_RouterCollector(counters, cfg.decodes, texts))
        return web.Response(body=generate_latest(reg),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    for pth in GENERATE_PATHS:
        app.router.add_post(pth, generate)
    for pth in FORWARD_GET:
        app.router.add_get(pth, forward)
    for pth in FORWARD_POST:
        app.router.add_post(pth, forward)
    app.router.add_get("/health", health)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/get_server_info", server_info)
    app.router.add_get("/metrics", metrics)
    return app


def _mode(got: tuple[int, bytes] | None) -> str | None:
    """The `disaggregation_mode` a worker's /server_info reports (None when it says none)."""
    if got is None or got[0] != 200:
        return None
    try:
        info = json.loads(got[1])
    except ValueError:
        return None
    mode = info.get("disaggregation_mode") if isinstance(info, dict) else None
    return mode if isinstance(mode, str) else None


class _RouterCollector:
    def __init__(self, c: _Counters, decodes: tuple[str, ...],
                 texts: list[tuple[int, bytes] | None]) -> None:
        self.c, self.decodes, self.texts = c, decodes, texts

    def collect(self):
        req = CounterMetricFamily("servelab:router_requests", "Requests answered, by path and "
                                  "status.", labels=["path", "code"])
        for (path, code), v in sorted(self.c.requests.items()):
            req.add_metric([path, str(code)], v)
        yield req
        up = CounterMetricFamily("servelab:router_upstream_errors", "Workers that could not be "
                                 "reached or broke off, by role.", labels=["role"])
        for role in ("prefill", "decode"):
            up.add_metric([role], self.c.upstream_errors.get(role, 0))
        yield up
        g = GaugeMetricFamily("servelab:router_requests_running", "Requests in flight.")
        g.add_metric([], self.c.in_flight)
        yield g
        merged: dict[str, Metric] = {}  # one family per name, however many workers
        for url, got in zip(self.decodes, self.texts, strict=True):
            if got is None or got[0] != 200:
                continue
            try:
                fams = list(text_string_to_metric_families(got[1].decode(errors="replace")))
            except ValueError:
                continue
            for fam in fams:
                m = merged.setdefault(fam.name, Metric(fam.name, fam.documentation, fam.type))
                for smp in fam.samples:
                    m.add_sample(smp.name, {**smp.labels, "worker": url}, smp.value)
        yield from merged.values()


def run_router(cfg: RouterConfig, host: str, port: int) -> None:
    """Bind (a busy port is a UserError), say ready, serve until SIGINT/SIGTERM."""
    import signal
    import socket

    from servelab.errors import UserError

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
              f"{','.join(p.url for p in cfg.prefills)} decode={','.join(cfg.decodes)} "
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
