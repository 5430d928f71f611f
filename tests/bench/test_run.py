"""bench/run.py: Ctrl-C during a load point, and how a server's description is read.

Ctrl-C stops a load point at once. asyncio.run turns the first Ctrl-C into a
cancellation of the main task and raises KeyboardInterrupt only if that task ends cancelled: a
task that absorbs one cancellation (as code under an HTTP client may) loses the Ctrl-C and runs
on, and its teardown waits for every task however long. Each case runs in its own process,
which sends itself SIGINT (never the test runner's own process).

`servelab bench` reads a server's description of itself as SGLang's own bench does:
`/server_info` first, `/get_server_info` (deprecated by SGLang) only as the fallback. Real
loopback HTTP servers serving one, the other, or both."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp
import pytest
from aiohttp import web

from servelab.bench.run import _server_info

SCRIPT = """
import asyncio, os, signal, sys, threading, time
from servelab.bench.run import run_interruptible

# as a program started in the foreground: a background job of a shell inherits SIGINT ignored
signal.signal(signal.SIGINT, signal.default_int_handler)

async def absorbs_one_cancellation():
    absorbed = False
    for _ in range(40):  # 2 s unless interrupted
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if absorbed:
                raise
            absorbed = True
    return "finished"

def run(c):
    if sys.argv[1] == "asyncio.run":
        return asyncio.run(c)
    return run_interruptible(c, grace_s=0.5)  # a task absorbing the cancel is left after 0.5 s

threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    print(run(absorbs_one_cancellation()), round(time.monotonic() - t0, 2))
except KeyboardInterrupt:
    print("interrupted", round(time.monotonic() - t0, 2))
    print("handler restored", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""


def _run(which: str) -> list[str]:
    p = subprocess.run([sys.executable, "-c", SCRIPT, which], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def test_ctrl_c_interrupts_a_load_point_that_absorbs_a_cancellation():
    out = _run("servelab")
    assert out[0] == "interrupted" and float(out[1]) < 1.5, out
    assert out[2:] == ["handler", "restored", "True"], out


def test_plain_asyncio_run_loses_that_ctrl_c():
    # the reference: why run_interruptible exists (if a future Python stops losing it, this
    # test says so and the wrapper can go)
    out = _run("asyncio.run")
    assert out[0] == "finished" and float(out[1]) >= 1.5, out


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
