"""Running the scripted server from Python: on a thread of this process (`serve_in_thread`) or
as a separate process (`serve_subprocess`, its own core and GIL: use it when timing accuracy
matters); both yield a `Handle` with the URL and the server-side request log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from servelab.bench.scripted.script import Script
from servelab.bench.scripted.server import start_server


@dataclass
class Handle:
    """A running scripted server: its URL and the server-side request log."""

    url: str
    port: int

    def log(self) -> list[dict[str, Any]]:
        """Server-side records of every request so far (see `_Req`)."""
        with urllib.request.urlopen(self.url + "/_scripted/log", timeout=30) as f:
            return json.loads(f.read())

    def reset(self) -> None:
        req = urllib.request.Request(self.url + "/_scripted/reset", data=b"{}", method="POST")
        with urllib.request.urlopen(req, timeout=30):
            pass


@contextlib.contextmanager
def serve_in_thread(script: Script, host: str = "127.0.0.1", port: int = 0) -> Iterator[Handle]:
    """Run the server on its own event loop in a daemon thread (shares the GIL with the caller:
    use `serve_subprocess` when timing accuracy matters)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        asyncio.set_event_loop(loop)
        try:
            box["runner"], box["port"] = loop.run_until_complete(start_server(script, host, port))
        except BaseException as exc:  # surfaced to the caller below
            box["error"] = exc
            ready.set()
            return
        ready.set()
        loop.run_forever()

    th = threading.Thread(target=main, name="scripted-server", daemon=True)
    th.start()
    ready.wait(30)
    if "error" in box:
        raise box["error"]
    try:
        yield Handle(url=f"http://{host}:{box['port']}", port=box["port"])
    finally:
        fut = asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop)
        with contextlib.suppress(Exception):
            fut.result(10)
        loop.call_soon_threadsafe(loop.stop)
        th.join(10)


def script_argv(script: Script, host: str = "127.0.0.1", port: int = 0) -> list[str]:
    """The command line that runs `script` in a separate process."""
    a = [sys.executable, "-m", "servelab.bench.scripted", "--host", host, "--port", str(port),
         "--ttft-ms", str(script.ttft_ms), "--gap-ms", str(script.gap_ms),
         "--tokens-per-chunk", str(script.tokens_per_chunk),
         "--default-max-tokens", str(script.default_max_tokens),
         "--fail-rate", str(script.fail_rate), "--fail-modes", ",".join(script.fail_modes),
         "--stall-s", str(script.stall_s), "--seed", str(script.seed), "--model", script.model,
         "--flavor", script.flavor]
    if script.natural_len is not None:
        a += ["--natural-len", str(script.natural_len)]
    if not script.tokenize:
        a.append("--no-tokenize")
    if not script.metrics:
        a.append("--no-metrics")
    if not script.record_log:
        a.append("--no-log")
    if script.api_key:
        a += ["--api-key", script.api_key]
    if script.max_running is not None:
        a += ["--max-running", str(script.max_running)]
    if script.gap_per_running_ms:
        a += ["--gap-per-running-ms", str(script.gap_per_running_ms)]
    if script.cache_block is not None:
        a += ["--cache-block", str(script.cache_block)]
    if script.echo:
        a.append("--echo")
    return a


@contextlib.contextmanager
def serve_subprocess(script: Script, host: str = "127.0.0.1", port: int = 0,
                     timeout_s: float = 30.0) -> Iterator[Handle]:
    """Run the server as a separate Python process (its own core and GIL); stopped on exit."""
    proc = subprocess.Popen(script_argv(script, host, port), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        line = ""
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("scripted-server ready ") or not line:
                break
        if not line.startswith("scripted-server ready "):
            proc.kill()
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"scripted server did not start: {line!r} {err[-2000:]}")
        url = line.split()[-1]
        yield Handle(url=url, port=int(url.rsplit(":", 1)[1]))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
