"""`python -m servelab.bench.scripted`: the scripted server as its own process (the experiment
runner's fake engine; flags in server.py's docstring). Prints `scripted-server ready
http://HOST:PORT` once it accepts connections and serves until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import signal

from servelab.bench.scripted.script import Script
from servelab.bench.scripted.server import start_server


def _parse(argv: list[str] | None) -> tuple[Script, str, int]:
    p = argparse.ArgumentParser(prog="python -m servelab.bench.scripted",
                                description="Loopback LLM server with scripted timings.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--gap-ms", type=float, default=10.0)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--natural-len", type=int, default=None)
    p.add_argument("--default-max-tokens", type=int, default=16)
    p.add_argument("--fail-rate", type=float, default=0.0)
    p.add_argument("--fail-modes", default="http500")
    p.add_argument("--stall-s", type=float, default=3600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="scripted-model")
    p.add_argument("--flavor", choices=("vllm", "sglang"), default="vllm")
    p.add_argument("--no-tokenize", action="store_true")
    p.add_argument("--no-metrics", action="store_true")
    p.add_argument("--no-log", action="store_true")
    p.add_argument("--api-key", default=None)
    p.add_argument("--max-running", type=int, default=None,
                   help="slots: at most this many requests served at once, the rest queue")
    p.add_argument("--gap-per-running-ms", type=float, default=0.0,
                   help="added to each decode step per other request in a slot")
    p.add_argument("--cache-block", type=int, default=None,
                   help="simulate a prefix cache of this block size and report cached_tokens")
    p.add_argument("--echo", action="store_true",
                   help="log prompts as received; answer each request with a word of its own")
    a = p.parse_args(argv)
    try:
        script = Script(ttft_ms=a.ttft_ms, gap_ms=a.gap_ms, tokens_per_chunk=a.tokens_per_chunk,
                        natural_len=a.natural_len, default_max_tokens=a.default_max_tokens,
                        fail_rate=a.fail_rate, fail_modes=tuple(m for m in a.fail_modes.split(",") if m),
                        stall_s=a.stall_s, seed=a.seed, model=a.model, flavor=a.flavor,
                        tokenize=not a.no_tokenize, metrics=not a.no_metrics,
                        record_log=not a.no_log, api_key=a.api_key, max_running=a.max_running,
                        gap_per_running_ms=a.gap_per_running_ms, cache_block=a.cache_block,
                        echo=a.echo)
    except ValueError as exc:
        p.error(str(exc))
    return script, a.host, a.port


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM/SIGINT; print the ready line first."""
    script, host, port = _parse(argv)

    async def run() -> None:
        runner, real_port = await start_server(script, host, port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print(f"scripted-server ready http://{host}:{real_port}", flush=True)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(run())


if __name__ == "__main__":
    main()
