"""CLI verb `serve`: run the embedded engine (servelab.mini) as an HTTP server.

Flag spelling follows SGLang's server arguments, so one experiment file can target either.
"""

from __future__ import annotations

import re

import typer

from servelab.errors import UserError

SPEC_ALGORITHMS = {"EAGLE": "EAGLE", "NEXTN": "EAGLE", "MTP": "EAGLE"}
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's


def serve(
    config: str = typer.Option("tiny", "--config", help="Model config: tiny (CPU, trained "
                               "weights) or flash (V4-Flash attention shapes, random weights)."),
    weights: str = typer.Option(None, "--weights", help="Checkpoint path (default: the shipped "
                                "one for the config, else random weights)."),
    random_weights: bool = typer.Option(False, "--random-weights", help="Ignore checkpoints."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(30000, "--port", min=1, max=65535),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    max_running_requests: int = typer.Option(8, "--max-running-requests", min=1, max=65536,
                                             help="KV slots; more requests queue (the KV "
                                             "cache they need must fit in free memory)."),
    context_length: int = typer.Option(1024, "--context-length", min=8,
                                       help="Max prompt + output tokens per request."),
    speculative_algorithm: str = typer.Option(None, "--speculative-algorithm",
                                              help="EAGLE (alias NEXTN, MTP): MTP-head drafts."),
    speculative_num_steps: int = typer.Option(1, "--speculative-num-steps", min=1, max=8),
    speculative_eagle_topk: int = typer.Option(1, "--speculative-eagle-topk", min=1),
    speculative_num_draft_tokens: int = typer.Option(None, "--speculative-num-draft-tokens",
                                                     min=2),
    cuda_graph: bool = typer.Option(False, "--cuda-graph", help="Capture decode/verify steps "
                                    "in CUDA graphs (needs --device cuda)."),
    attention_backend: str = typer.Option("torch", "--attention-backend",
                                          help="torch | naive | splitkv (Triton kernels)."),
    seed: int = typer.Option(0, "--seed", min=0, max=2**63 - 1,
                             help="Seed for random weights."),
    num_threads: int = typer.Option(1, "--num-threads", min=1, max=1024,
                                    help="torch CPU threads."),
    served_model_name: str = typer.Option(None, "--served-model-name"),
    log_level: str = typer.Option("warning", "--log-level"),
) -> None:
    """Serve the embedded engine: OpenAI + SGLang-style HTTP API, /metrics, profiling."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise UserError(f"--device {device}: use cpu, cuda or cuda:N")
    if log_level.lower() not in LOG_LEVELS:
        raise UserError(f"--log-level {log_level}: choose one of {', '.join(LOG_LEVELS)}")
    algo = None
    if speculative_algorithm:
        algo = SPEC_ALGORITHMS.get(speculative_algorithm.upper())
        if algo is None:
            raise UserError(f"--speculative-algorithm {speculative_algorithm} is not supported; "
                            f"use one of {sorted(SPEC_ALGORITHMS)}")
        if speculative_eagle_topk != 1:
            raise UserError("--speculative-eagle-topk must be 1 (the engine drafts a chain)")
        want = speculative_num_steps + 1
        if speculative_num_draft_tokens not in (None, want):
            typer.secho(f"warning: with --speculative-eagle-topk 1, --speculative-num-draft-tokens"
                        f" is num_steps + 1 = {want} (as SGLang adjusts it); got "
                        f"{speculative_num_draft_tokens}", err=True, fg=typer.colors.YELLOW)
        speculative_num_draft_tokens = want
    if attention_backend not in ("torch", "naive", "splitkv"):
        raise UserError(f"--attention-backend {attention_backend}: choose torch, naive or splitkv")

    from servelab.mini.engine import EngineArgs
    from servelab.mini.server import run_server

    args = EngineArgs(
        config=config, weights=weights, random_weights=random_weights, device=device,
        max_running_requests=max_running_requests, context_length=context_length,
        speculative_algorithm=algo, speculative_num_steps=speculative_num_steps,
        speculative_eagle_topk=speculative_eagle_topk,
        speculative_num_draft_tokens=speculative_num_draft_tokens or speculative_num_steps + 1,
        cuda_graph=cuda_graph, attention_backend=attention_backend, seed=seed,
        num_threads=num_threads,
    )
    run_server(args, host, port, served_model_name, log_level.lower())
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
