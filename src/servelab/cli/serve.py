"""CLI verb `serve`: run the embedded engine (servelab.mini) as an HTTP server.

Flag spelling follows SGLang's server arguments, so one experiment file can target either.
"""

from __future__ import annotations

import typer

from servelab.mini.engine.args import EngineArgs
from servelab.mini.server.args import (
    DEFAULT_BOOTSTRAP_PORT,
    DEFAULT_WAITING_TIMEOUT_S,
    ServeArgs,
    host_list,
)


def serve(
    config: str = typer.Option("tiny", "--config", help="Model config: tiny (CPU, trained "
                               "weights) or flash (V4-Flash attention shapes, random weights)."),
    weights: str = typer.Option(None, "--weights", help="Checkpoint path (default: the shipped "
                                "one for the config, else random weights)."),
    random_weights: bool = typer.Option(False, "--random-weights", help="Ignore checkpoints."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(30000, "--port", help="1..65535."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N."),
    max_running_requests: int = typer.Option(8, "--max-running-requests",
                                             help="KV slots, 1..65536; more requests queue (the "
                                             "KV cache they need must fit in free memory)."),
    context_length: int = typer.Option(1024, "--context-length",
                                       help="Max prompt + output tokens per request (>= 8)."),
    speculative_algorithm: str = typer.Option(None, "--speculative-algorithm",
                                              help="EAGLE (alias NEXTN, MTP): MTP-head drafts."),
    speculative_num_steps: int = typer.Option(1, "--speculative-num-steps", help="1..8."),
    speculative_eagle_topk: int = typer.Option(1, "--speculative-eagle-topk",
                                               help="1 (the engine drafts a chain)."),
    speculative_num_draft_tokens: int = typer.Option(None, "--speculative-num-draft-tokens",
                                                     help="num_steps + 1 with topk 1."),
    cuda_graph: bool = typer.Option(False, "--cuda-graph", help="Capture decode/verify steps "
                                    "in CUDA graphs (needs --device cuda)."),
    attention_backend: str = typer.Option("torch", "--attention-backend",
                                          help="torch | naive | splitkv (Triton kernels)."),
    seed: int = typer.Option(0, "--seed", help="Seed for random weights (0..2^63-1)."),
    num_threads: int = typer.Option(1, "--num-threads", help="torch CPU threads, 1..1024."),
    served_model_name: str = typer.Option(None, "--served-model-name"),
    log_level: str = typer.Option("warning", "--log-level"),
    disable_radix_cache: bool = typer.Option(
        False, "--disable-radix-cache", help="Turn the prefix cache off (it reuses the KV of "
        "prompt prefixes seen before; on by default, as in SGLang)."),
    page_size: int = typer.Option(16, "--page-size", help="Tokens per prefix-cache block: "
                                  "prefixes are reused in whole blocks (1..4096)."),
    disaggregation_mode: str = typer.Option(
        "null", "--disaggregation-mode", help="null (one server), prefill or decode: SGLang's "
        "prefill/decode disaggregation, fronted by `servelab router --pd-disaggregation`."),
    disaggregation_bootstrap_port: int = typer.Option(
        DEFAULT_BOOTSTRAP_PORT, "--disaggregation-bootstrap-port",
        help="Prefill: the port decode servers fetch KV from."),
    disaggregation_waiting_timeout: float = typer.Option(
        DEFAULT_WAITING_TIMEOUT_S, "--disaggregation-waiting-timeout",
        help="Decode: seconds a request waits for its KV before it fails (SGLang's "
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT)."),
    disaggregation_allowed_bootstrap_hosts: str = typer.Option(
        None, "--disaggregation-allowed-bootstrap-hosts", metavar="HOST[,HOST...]",
        help="Decode: hosts (names, addresses, networks such as 10.0.0.0/8, or * for any) a "
        "request's bootstrap_host may name, besides loopback and this machine's addresses."),
) -> None:
    """Serve the embedded engine: OpenAI + SGLang-style HTTP API, /metrics, profiling."""
    # Bounds and choices live in one typed model (mini/server/args.py), which `servelab run
    # --check` also judges an experiment's flags with: both refuse a value with the same line.
    flags = {k: v for k, v in locals().items()}
    a = ServeArgs.from_flags(flags)
    algo = a.algorithm
    want = a.speculative_num_steps + 1
    if algo and a.speculative_num_draft_tokens not in (None, want):
        typer.secho(f"warning: with --speculative-eagle-topk 1, --speculative-num-draft-tokens"
                    f" is num_steps + 1 = {want} (as SGLang adjusts it); got "
                    f"{a.speculative_num_draft_tokens}", err=True, fg=typer.colors.YELLOW)

    from servelab.mini.server.app import run_server  # torch, FastAPI: only when serving

    args = EngineArgs(
        config=a.config, weights=a.weights, random_weights=a.random_weights, device=a.device,
        max_running_requests=a.max_running_requests, context_length=a.context_length,
        speculative_algorithm=algo, speculative_num_steps=a.speculative_num_steps,
        speculative_eagle_topk=a.speculative_eagle_topk,
        speculative_num_draft_tokens=want, cuda_graph=a.cuda_graph,
        attention_backend=a.attention_backend, seed=a.seed, num_threads=a.num_threads,
        disaggregation_mode=a.disaggregation_mode, disable_radix_cache=a.disable_radix_cache,
        page_size=a.page_size,
    )
    run_server(args, a.host, a.port, a.served_model_name, a.log_level,
               bootstrap_port=a.disaggregation_bootstrap_port,
               waiting_timeout_s=a.disaggregation_waiting_timeout,
               allowed_bootstrap_hosts=host_list(a.disaggregation_allowed_bootstrap_hosts))
    # The engine is stopped and output flushed; skip the interpreter's slow teardown (~2 s of
    # torch/thread clean-up measured here) so that experiment runners can restart us quickly.
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def register(app: typer.Typer) -> None:
    """Add the `serve` verb."""
    app.command("serve")(serve)
