"""The router's own endpoints: `/health` (200 only when every worker's /health is and each
reports the role it is routed as), `/server_info` and `/get_server_info` (the first decode
worker's, plus the PD layout), `/metrics` (the router's counters, then each decode worker's
series labelled `worker`, so a scraper of the endpoint sees the spec-decode and KV-transfer
counters of the servers that decode, and each prefill worker's prefix-cache series, which only
a prefill server counts)."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from servelab.mini.router.state import Counters, RouterState, error, mode_of
from servelab.redaction import redact_url

# the series of a prefill worker the router re-exports: its prefix cache (a decode server keeps
# none); the rest of a prefill's series would collide with the decode workers' names
PREFILL_SERIES = ("prefix_cache_", "cache_hit_rate")


class _RouterCollector:
    def __init__(self, c: Counters, workers: list[tuple[str, bool]],
                 texts: list[tuple[int, bytes] | None]) -> None:
        """`workers`: (url, is a prefill) in the order of `texts`, their /metrics answers."""
        self.c, self.workers, self.texts = c, workers, texts

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
        for (url, prefill), got in zip(self.workers, self.texts, strict=True):
            if got is None or got[0] != 200:
                continue
            try:
                fams = list(text_string_to_metric_families(got[1].decode(errors="replace")))
            except ValueError:
                continue
            for fam in fams:
                if prefill and not any(k in fam.name for k in PREFILL_SERIES):
                    continue
                m = merged.setdefault(fam.name, Metric(fam.name, fam.documentation, fam.type))
                for smp in fam.samples:
                    m.add_sample(smp.name, {**smp.labels, "worker": redact_url(url)}, smp.value)
        yield from merged.values()


def add_routes(app: web.Application, state: RouterState) -> None:
    """/health, /server_info (and /get_server_info), /metrics."""
    cfg = state.cfg

    async def health(_request: web.Request) -> web.Response:
        roles = [(p.url, "prefill") for p in cfg.prefills] + [(d, "decode") for d in cfg.decodes]
        got = await asyncio.gather(*(state.get(u + "/health", 2.0) for u, _ in roles))
        bad = [u for (u, _), g in zip(roles, got, strict=True) if g is None or g[0] != 200]
        if bad:
            return error(503, f"worker(s) not healthy: {', '.join(bad)}")
        # a worker named in the wrong role (a prefill given as --decode) would answer every
        # request with one token: refuse to be healthy, naming it
        infos = await asyncio.gather(*(state.get(u + "/server_info", 2.0) for u, _ in roles))
        wrong = [f"{u} runs --disaggregation-mode {mode}, routed as {role}"
                 for (u, role), g in zip(roles, infos, strict=True)
                 if (mode := mode_of(g)) is not None and mode != role]
        if wrong:
            return error(503, f"worker(s) in the wrong role: {'; '.join(wrong)}")
        return web.Response(status=200)

    async def server_info(_request: web.Request) -> web.Response:
        got = await state.get(cfg.decodes[0] + "/server_info")
        if got is None or got[0] != 200:
            got = await state.get(cfg.decodes[0] + "/get_server_info")
        info: dict = {}
        if got is not None and got[0] == 200:
            try:
                info = json.loads(got[1])
            except ValueError:
                info = {}
        info = info if isinstance(info, dict) else {"value": info}
        info["router"] = {"pd_disaggregation": True, "policy": cfg.policy,
                          "prefill": [[redact_url(p.url), p.bootstrap_port] for p in cfg.prefills],
                          "decode": [redact_url(d) for d in cfg.decodes]}
        return web.json_response(info)

    async def metrics(_request: web.Request) -> web.Response:
        workers = [(d, False) for d in cfg.decodes] + [(p.url, True) for p in cfg.prefills]
        texts = await asyncio.gather(*(state.get(u + "/metrics") for u, _ in workers))
        reg = CollectorRegistry(auto_describe=False)
        reg.register(_RouterCollector(state.counters, workers, texts))
        return web.Response(body=generate_latest(reg),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/health", health)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/get_server_info", server_info)
    app.router.add_get("/metrics", metrics)
