"""CLI verb: `servelab bench` - measure one running server under load, one load point per
concurrency or request rate. Thin: builds the typed configs and calls servelab.bench.run.

Numbers are taken as text and parsed by servelab.bench.config so that a bad value gives the
one-line `error: ...` of servelab.errors.UserError (exit 2), not a usage box.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import typer

from servelab.cli.results import STORE_HELP
from servelab.errors import UserError


def _check_output(path: str) -> None:
    """Refuse an --output that cannot be written before any load is sent (it is written only
    after the first load point, so a bad path used to end a long run with a traceback)."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"--output {path} is a folder; give a file name, e.g. {p / 'bench.json'}")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--output {path}: cannot create its folder ({exc.strerror})") from None
    try:  # a probe file where the atomic write will put its temp file
        fd, probe = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UserError(f"--output {path}: cannot write in {p.parent} ({exc.strerror}); "
                        "give a path you can write") from None


def register(app: typer.Typer) -> None:
    """Add `bench` to the app."""

    @app.command("bench")
    def bench(
        base_url: str = typer.Option(None, "--base-url", help="Server root, e.g. http://127.0.0.1:30000."),
        model: str = typer.Option(None, "--model", help="Model name (default: the first of /v1/models)."),
        api: str = typer.Option("completions", "--api", help="completions | chat | sglang (/generate)."),
        concurrency: str = typer.Option(None, "--concurrency", help="Closed loop: in-flight requests, e.g. 1,8,16."),
        request_rate: str = typer.Option(None, "--request-rate", help="Open loop: requests/s, e.g. 4,8."),
        burstiness: str = typer.Option("1.0", "--burstiness", help="Gamma shape of arrivals (1 = Poisson)."),
        num_prompts: str = typer.Option("100", "--num-prompts", help="Measured requests per load point."),
        input_len: str = typer.Option("256", "--input-len", help="Prompt tokens (exact with /tokenize or --tokenizer)."),
        output_len: str = typer.Option("256", "--output-len", help="Output tokens (max_tokens + ignore_eos)."),
        dataset: str = typer.Option(None, "--dataset", help="ShareGPT-format JSON file instead of fixed lengths."),
        seed: str = typer.Option("0", "--seed", help="Seed of prompts and arrival times."),
        warmup: str = typer.Option("0", "--warmup", help="Requests sent first and excluded from the metrics."),
        max_duration: str = typer.Option(None, "--max-duration", help="Stop issuing requests after S seconds."),
        goodput: str = typer.Option(None, "--goodput", help="SLOs in ms, e.g. ttft_ms=500,tpot_ms=50,e2e_ms=20000."),
        tokenizer: str = typer.Option(None, "--tokenizer", help="HF tokenizers file/folder for exact lengths."),
        request_timeout: str = typer.Option("600", "--request-timeout", help="Seconds before a request counts as failed."),
        output: str = typer.Option(None, "--output", help="Write all load points (and provenance) to this JSON file."),
        store: str = typer.Option(None, "--store", help=STORE_HELP),
        label: str = typer.Option(None, "--label", help="A name for these rows in the store."),
        no_store: bool = typer.Option(False, "--no-store", help="Do not write to the results store."),
        quiet: bool = typer.Option(False, "--quiet", help="No live progress."),
    ) -> None:
        """Measure a running OpenAI-compatible or SGLang server under load.

        Sends `Authorization: Bearer $SERVELAB_API_KEY` (or $OPENAI_API_KEY) when set.
        """
        import orjson

        from servelab import atomic, provenance
        from servelab.bench.config import (
            BenchConfig,
            LoadPoint,
            WorkloadConfig,
            parse_goodput,
            parse_list,
            parse_number,
        )
        from servelab.bench.report import summary_table
        from servelab.bench.run import run_load_point, save_load_point
        from servelab.cli.console import make_console

        if not base_url:
            raise UserError("--base-url is required, e.g. --base-url http://127.0.0.1:30000")
        if (concurrency is None) == (request_rate is None):
            raise UserError("give exactly one of --concurrency (e.g. 1,8,16) or --request-rate (e.g. 4,8)")
        wl = WorkloadConfig(
            input_len=parse_number(input_len, int, "--input-len"),
            output_len=parse_number(output_len, int, "--output-len"),
            num_prompts=parse_number(num_prompts, int, "--num-prompts"),
            dataset=dataset, seed=parse_number(seed, int, "--seed"), tokenizer=tokenizer,
        )
        cfg = BenchConfig(
            base_url=base_url, workload=wl, model=model, api=api,
            warmup=parse_number(warmup, int, "--warmup"),
            max_duration_s=parse_number(max_duration, float, "--max-duration"),
            request_timeout_s=parse_number(request_timeout, float, "--request-timeout"),
            goodput=parse_goodput(goodput),
        )
        if output:
            _check_output(output)
        b = parse_number(burstiness, float, "--burstiness")
        if concurrency is not None:
            loads = [LoadPoint(concurrency=c) for c in parse_list(concurrency, int, "--concurrency")]
        else:
            loads = [LoadPoint(request_rate=r, burstiness=b)
                     for r in parse_list(request_rate, float, "--request-rate")]
        st = None
        if not no_store:
            from servelab.store import Store

            st = Store(store)
        console = make_console()
        out: list[dict] = []
        for lp in loads:
            res = run_load_point(cfg, lp, progress=not quiet)
            row = save_load_point(st, cfg, lp, res, label=label) if st is not None else None
            console.print(summary_table(res.summary, title=f"{lp.key}  ({cfg.base_url}, {cfg.api})"
                                        + (f"  stored as #{row}" if row else "")))
            util = res.summary.get("client_cpu_util")
            # under ~1 s (e.g. every request refused at once) start-up CPU dominates the ratio
            if util is not None and util > 0.8 and res.summary["duration_s"] >= 1.0:
                console.print(f"warning: the client used {util:.0%} of a core during this "
                              "load point: it may limit what was measured (see docs/METRICS.md)",
                              style="yellow")
            mism = res.summary.get("output_len_mismatch")
            if mism:  # e.g. a server that ignores ignore_eos/min_tokens
                by_chunks = "chunks" in (res.summary.get("output_tokens_source") or {})
                why = ("counted one token per chunk: the server sent no usage; --tokenizer "
                       "counts the text") if by_chunks else \
                    "does the server honour ignore_eos / min_tokens?"
                console.print(f"warning: {mism} of {res.summary['completed']} completed "
                              f"requests returned another output length than asked ({why})"
                              "", style="yellow")
            if res.summary["issued"] == 0:
                console.print("no request was sent: --max-duration ended the load point "
                              "before the first one", style="red")
            elif res.summary["completed"] == 0:
                reasons = ", ".join(f"{k} x{v}" for k, v in res.summary["failure_reasons"].items())
                console.print(f"every request failed ({reasons})", style="red")
            # one example per reason: 'http_400 x100' alone does not say the model name was wrong
            seen: set[str] = set()
            for rec in res.records:
                if rec["error"] and rec["error"] not in seen:
                    seen.add(rec["error"])
                    console.print(f"  {rec['error']}: {rec['error_detail'] or ''}"[:300],
                                  markup=False, highlight=False)
            out.append({**res.summary, "store_id": row})
            if output:  # rewritten after every load point, so a crash keeps what was measured
                doc = {"provenance": provenance.collect(server_info=res.server_info,
                                                        workload_seed=wl.seed),
                       "load_points": out}
                try:
                    atomic.write_bytes(output, orjson.dumps(doc, option=orjson.OPT_INDENT_2
                                                            | orjson.OPT_SERIALIZE_NUMPY))
                except OSError as exc:
                    raise UserError(f"--output {output}: cannot write ({exc.strerror or exc})"
                                    + ("; the load points are in the store" if st else "")) from None
        if st is not None:
            st.close()
        if all(s["completed"] == 0 for s in out):
            raise typer.Exit(1)  # nothing was measured: let scripts notice
