"""`servelab bench` reads a server's description of itself as SGLang's own bench does:
`/server_info` first, `/get_server_info` (deprecated by SGLang) only as the fallback. Real
loopback HTTP servers serving one, the other, or both."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from servelab.bench.run import _server_info


async def _serve(paths: dict[str, dict]) -> tuple[web.AppRunner, str, list[str]]:
    hits: list[str] = []
    app = web.Application()
    for path, body in paths.items():
        async def handler(request: web.Request, body: dict = body) -> web.Response:
            hits.append(request.path)
            return web.json_response(body)
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}", hits


@pytest.mark.parametrize(("served", "key", "want_hits"), [
    ({"/server_info": {"v": "new"}}, "server_info", ["/server_info"]),
    ({"/server_info": {"v": "new"}, "/get_server_info": {"v": "old"}}, "server_info",
     ["/server_info"]),
    ({"/get_server_info": {"v": "old"}}, "get_server_info", ["/server_info", "/get_server_info"]),
])
def test_server_info_first_get_server_info_as_fallback(served, key, want_hits):
    async def go():
        runner, root, hits = await _serve(served)
        try:
            async with aiohttp.ClientSession() as s:
                info = await _server_info(s, root)
        finally:
            await runner.cleanup()
        return info, hits

    info, hits = asyncio.run(go())
    assert list(k for k in info if k != "v1_models") == [key]
    assert info[key] == served["/" + key]
    assert [h for h in hits if h != "/v1/models"] == [h for h in want_hits if h in served]
