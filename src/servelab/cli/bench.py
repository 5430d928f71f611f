"""CLI verb: `servelab bench` - measure one running server under load, one load point per
concurrency or request rate, or a capacity sweep (`--sweep --slo ...`). Thin: builds the typed
configs and calls servelab.bench.run (and servelab.bench.sweep).

Flag names follow servelab's own vocabulary; SGLang's `bench_serving` and vLLM's `bench serve`
spellings are accepted as aliases (`--max-concurrency`, `--num-warmups` / `--warmup-requests`,
`--output-file`, `--save-result` with `--result-dir` / `--result-filename`, `--random-input-len`,
`--random-output-len`, `--dataset-path`, `--goodput ttft:500`), so a command line copied from
them runs here.

Numbers are taken as text and parsed by servelab.bench.config so that a bad value gives the
one-line `error: ...` of servelab.errors.UserError (exit 2), not a usage box.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

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


def _result_path(output: str | None, save_result: bool, result_dir: str | None,
                 result_filename: str | None) -> str | None:
    """--output / --output-file, or vLLM's --save-result [--result-dir D] [--result-filename F]."""
    if output and (save_result or result_filename or result_dir):
        raise UserError("give --output (--output-file) or --save-result [--result-dir] "
                        "[--result-filename], not both")
    if not save_result:
        if result_filename or result_dir:
            raise UserError("--result-dir / --result-filename take effect with --save-result")
        return output
    name = result_filename or time.strftime("servelab-bench-%Y%m%d-%H%M%S.json")
    return str(Path(result_dir or ".") / name)


def _loads(concurrency: str | None, request_rate: str | None, burstiness: float) -> list:
    """The load points asked for. vLLM's `--request-rate inf --max-concurrency C` (every request
    released at once, at most C in flight) is a closed loop at C, and is taken as one."""
    from servelab.bench.config import LoadPoint, parse_list

    rates = parse_list(request_rate, float, "--request-rate") if request_rate is not None else None
    if concurrency is not None:
        if rates is not None and not all(math.isinf(r) for r in rates):
            raise UserError("--concurrency (--max-concurrency) with a finite --request-rate (a rate "
                            "capped by a concurrency) is not supported: servelab measures a closed "
                            "loop (--concurrency) or an open loop (--request-rate); drop one")
        return [LoadPoint(concurrency=c) for c in parse_list(concurrency, int, "--concurrency")]
    if rates is None:
        raise UserError("give --concurrency (e.g. 1,8,16), --request-rate (e.g. 4,8 or inf) or "
                        "--sweep")
    return [LoadPoint(request_rate=r, burstiness=burstiness) for r in rates]


def _report_point(console: Any, res: Any, title: str, full: bool) -> None:
    """The load point's table (or one line in a sweep) and its warnings."""
    from servelab.bench.report import summary_table

    s = res.summary
    if full:
        console.print(summary_table(s, title=title))
    else:
        console.print(title, markup=False, highlight=False)
    util = s.get("client_cpu_util")
    # under ~1 s (e.g. every request refused at once) start-up CPU dominates the ratio
    if util is not None and util > 0.8 and s["duration_s"] >= 1.0:
        console.print(f"warning: the client used {util:.0%} of a core during this "
                      "load point: it may limit what was measured (see docs/METRICS.md)",
                      style="yellow")
    mism = s.get("output_len_mismatch")
    if mism:  # e.g. a server that ignores ignore_eos/min_tokens
        by_chunks = "chunks" in (s.get("output_tokens_source") or {})
        why = ("counted one token per chunk: the server sent no usage; --tokenizer "
               "counts the text") if by_chunks else "does the server honour ignore_eos / min_tokens?"
        console.print(f"warning: {mism} of {s['completed']} completed "
                      f"requests returned another output length than asked ({why})",
                      style="yellow")
    if s["issued"] == 0:
        console.print("no request was sent: --max-duration ended the load point "
                      "before the first one", style="red")
    elif s["completed"] == 0:
        reasons = ", ".join(f"{k} x{v}" for k, v in s["failure_reasons"].items())
        console.print(f"every request failed ({reasons})", style="red")
    # one example per reason: 'http_400 x100' alone does not say the model name was wrong
    seen: set[str] = set()
    for rec in res.records:
        if rec["error"] and rec["error"] not in seen:
            seen.add(rec["error"])
            console.print(f"  {rec['error']}: {rec['error_detail'] or ''}"[:300],
                          markup=False, highlight=False)


def _ms(stat: Any, key: str) -> str:
    v = stat.get(key) if isinstance(stat, dict) else None
    return "-" if v is None else f"{v:,.1f}"


def _point_line(p: Any, store_id: int | None) -> str:
    """One line per sweep point: role, load, achieved rate, the usual SLO latencies, verdict."""
    s = p.summary
    rate = s.get("request_throughput_req_s")
    verdict = "" if p.check is None else ("  SLO met" if p.check.met else
                                          "  SLO missed: " + "; ".join(p.check.reasons))
    return (f"{p.role:<11} {p.load.key:<12} {'-' if rate is None else f'{rate:.3f}':>8} req/s  "
            f"TTFT p99 {_ms(s.get('ttft_ms'), 'p99')} ms  TPOT p99 {_ms(s.get('tpot_ms'), 'p99')}"
            f" ms  E2E p99 {_ms(s.get('e2e_ms'), 'p99')} ms  failed {s.get('failed')}"
            + (f"  #{store_id}" if store_id else "") + verdict)


def _sweep_table(result: Any, slo: Any) -> Any:
    """The sweep's points ordered by load, and the capacity."""
    from rich.table import Table

    title = "capacity sweep" + (f" under {slo.describe()}" if slo else "")
    t = Table(title=title, title_justify="left")
    for c in ("role", "load", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
              "TPOT p99", "E2E p99", "failed", "SLO"):
        t.add_column(c, justify="left" if c in ("role", "load", "SLO") else "right")

    def order(p: Any) -> float:
        return 0.0 if p.load.concurrency else p.load.request_rate

    for p in sorted(result.points, key=order):
        s = p.summary
        rate, tok = s.get("request_throughput_req_s"), s.get("output_throughput_tok_s")
        verdict = "" if p.check is None else ("met" if p.check.met else "missed")
        t.add_row(p.role, p.load.key, "-" if rate is None else f"{rate:.3f}",
                  "-" if tok is None else f"{tok:,.1f}",
                  _ms(s.get("ttft_ms"), "median"), _ms(s.get("ttft_ms"), "p99"),
                  _ms(s.get("tpot_ms"), "median"), _ms(s.get("tpot_ms"), "p99"),
                  _ms(s.get("e2e_ms"), "p99"), str(s.get("failed")), verdict)
    return t


def register(app: typer.Typer) -> None:
    """Add `bench` to the app."""

    @app.command("bench")
    def bench(
        base_url: str = typer.Option(None, "--base-url", help="Server root, e.g. http://127.0.0.1:30000."),
        model: str = typer.Option(None, "--model", help="Model name (default: the first of /v1/models)."),
        api: str = typer.Option("completions", "--api", help="completions | chat | sglang (/generate)."),
        concurrency: str = typer.Option(None, "--concurrency", "--max-concurrency",
                                        help="Closed loop: in-flight requests, e.g. 1,8,16."),
        request_rate: str = typer.Option(None, "--request-rate",
                                         help="Open loop: requests/s, e.g. 4,8; inf: all at once."),
        burstiness: str = typer.Option("1.0", "--burstiness", help="Gamma shape of arrivals (1 = Poisson)."),
        num_prompts: str = typer.Option("100", "--num-prompts", help="Measured requests per load point."),
        input_len: str = typer.Option("256", "--input-len", "--random-input-len",
                                      help="Prompt tokens (exact with /tokenize or --tokenizer)."),
        output_len: str = typer.Option("256", "--output-len", "--random-output-len",
                                       help="Output tokens (max_tokens + ignore_eos)."),
        dataset: str = typer.Option(None, "--dataset", "--dataset-path",
                                    help="ShareGPT-format JSON file instead of fixed lengths."),
        seed: str = typer.Option("0", "--seed", help="Seed of prompts and arrival times."),
        warmup: str = typer.Option("0", "--warmup", "--num-warmups", "--warmup-requests",
                                   help="Requests sent first and excluded from the metrics."),
        max_duration: str = typer.Option(None, "--max-duration", help="Stop issuing requests after S seconds."),
        goodput: str = typer.Option(None, "--goodput", help="Per-request SLOs in ms for goodput, e.g. "
                                    "ttft_ms=500,tpot_ms=50 or 'ttft:500 tpot:50 e2el:20000'."),
        tokenizer: str = typer.Option(None, "--tokenizer", help="HF tokenizers file/folder for exact lengths."),
        request_timeout: str = typer.Option("600", "--request-timeout", help="Seconds before a request counts as failed."),
        output: str = typer.Option(None, "--output", "--output-file",
                                   help="Write all load points (and provenance) to this JSON file."),
        save_result: bool = typer.Option(False, "--save-result", help="Write the JSON file to "
                                         "--result-dir/--result-filename (vLLM's spelling)."),
        result_dir: str = typer.Option(None, "--result-dir", help="With --save-result: folder (default .)."),
        result_filename: str = typer.Option(None, "--result-filename", help="With --save-result: "
                                            "file name (default servelab-bench-DATE.json)."),
        sweep: bool = typer.Option(False, "--sweep", help="Capacity sweep: synchronous, saturated, "
                                   "then rates between, refined where --slo is crossed."),
        slo: str = typer.Option(None, "--slo", help="SLOs of the sweep, e.g. ttft_p99_ms=2000,"
                                "tpot_p99_ms=50, or per request 'ttft:500 tpot:50' (docs/METRICS.md)."),
        sweep_precision: str = typer.Option("0.1", "--sweep-precision", help="Stop when the capacity "
                                            "bracket is this narrow, relative (0.1 = 10%)."),
        sweep_rates: str = typer.Option("3", "--sweep-rates", help="Open-loop rates evenly spaced "
                                        "between the synchronous and saturated ones."),
        sweep_max_points: str = typer.Option("12", "--sweep-max-points", help="At most this many "
                                             "load points in a sweep, all included."),
        store: str = typer.Option(None, "--store", help=STORE_HELP),
        label: str = typer.Option(None, "--label", help="A name for these rows in the store."),
        no_store: bool = typer.Option(False, "--no-store", help="Do not write to the results store."),
        quiet: bool = typer.Option(False, "--quiet", help="No live progress."),
        as_json: bool = typer.Option(False, "--json", help="Print every load point (and the sweep) "
                                     "as one JSON document on stdout; tables go to stderr."),
    ) -> None:
        """Measure a running OpenAI-compatible or SGLang server under load: at the load points
        given, or a capacity sweep under SLOs (--sweep --slo ttft_p99_ms=2000,tpot_p99_ms=50).

        Sends `Authorization: Bearer $SERVELAB_API_KEY` (or $OPENAI_API_KEY) when set.
        """
        import orjson

        from servelab import atomic, provenance
        from servelab.bench.config import (
            BenchConfig,
            WorkloadConfig,
            parse_goodput,
            parse_number,
        )
        from servelab.bench.run import run_load_point, save_load_point
        from servelab.bench.slo import parse_slo
        from servelab.bench.sweep import SweepConfig, SweepPoint
        from servelab.bench.sweep import sweep as run_sweep
        from servelab.cli.console import make_console

        if not base_url:
            raise UserError("--base-url is required, e.g. --base-url http://127.0.0.1:30000")
        b = parse_number(burstiness, float, "--burstiness")
        slos = parse_slo(slo)
        if sweep:
            if concurrency is not None or request_rate is not None:
                raise UserError("--sweep chooses its own load points: drop --concurrency / "
                                "--request-rate")
            scfg = SweepConfig(slo=slos, precision=parse_number(sweep_precision, float, "--sweep-precision"),
                               grid_rates=parse_number(sweep_rates, int, "--sweep-rates"),
                               max_points=parse_number(sweep_max_points, int, "--sweep-max-points"),
                               burstiness=b)
            loads = []
        else:
            if slos is not None:
                raise UserError("--slo sets the objectives of a capacity sweep: add --sweep (for "
                                "goodput at given load points use --goodput)")
            loads = _loads(concurrency, request_rate, b)
        gp = parse_goodput(goodput)
        if slos is not None:
            if gp and slos.per_request and gp != slos.per_request:
                raise UserError("the per-request SLOs of --slo and --goodput differ: give them once, "
                                "in --slo")
            gp = gp or slos.goodput()
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
            goodput=gp,
        )
        output = _result_path(output, save_result, result_dir, result_filename)
        if output:
            _check_output(output)
        st = None
        if not no_store:
            from servelab.store import Store

            st = Store(store)
        console = make_console(stderr=as_json)
        quiet = quiet or as_json
        out: list[dict] = []
        sweep_doc: dict[str, Any] | None = None
        server_info: dict[str, Any] = {}

        def write_output() -> None:
            """Rewritten after every load point, so a crash keeps what was measured."""
            if not output:
                return
            doc: dict[str, Any] = {"provenance": provenance.collect(server_info=server_info,
                                                                    workload_seed=wl.seed),
                                   "load_points": out}
            if sweep_doc is not None:
                doc["sweep"] = sweep_doc
            try:
                atomic.write_bytes(output, orjson.dumps(doc, option=orjson.OPT_INDENT_2
                                                        | orjson.OPT_SERIALIZE_NUMPY))
            except OSError as exc:
                raise UserError(f"--output {output}: cannot write ({exc.strerror or exc})"
                                + ("; the load points are in the store" if st else "")) from None

        def keep(lp: Any, res: Any, line: Any = None) -> int | None:
            """Store and print one load point (a table; `line(store_id)` in a sweep); the
            caller rewrites --output once the point is complete."""
            nonlocal server_info
            server_info = res.server_info
            row = save_load_point(st, cfg, lp, res, label=label) if st is not None else None
            if line is None:
                _report_point(console, res, f"{lp.key}  ({cfg.shown_url}, {cfg.api})"
                              + (f"  stored as #{row}" if row else ""), full=True)
            else:
                _report_point(console, res, line(row), full=False)
            out.append({**res.summary, "store_id": row})
            return row

        if not sweep:
            for lp in loads:
                keep(lp, run_load_point(cfg, lp, progress=not quiet))
                write_output()
        else:
            sweep_id = "sweep-" + uuid.uuid4().hex[:8]
            label = label or sweep_id
            sweep_doc = {"id": sweep_id, "slo": slos.to_dict() if slos else None,
                         "capacity": None, "points": []}
            results: dict[str, Any] = {}

            def measure(lp: Any) -> dict[str, Any]:
                res = run_load_point(cfg, lp, progress=not quiet)
                results[lp.key] = res
                return res.summary

            def on_point(p: SweepPoint) -> None:
                res = results.pop(p.load.key)
                c = p.check
                res.summary["sweep"] = {"id": sweep_id, "role": p.role,
                                        "slo_met": None if c is None else c.met,
                                        "slo_ratio": None if c is None else c.ratio}
                assert sweep_doc is not None
                sweep_doc["points"].append({"role": p.role, "load_key": p.load.key,
                                            "slo_met": None if c is None else c.met,
                                            "slo_reasons": [] if c is None else list(c.reasons)})
                row = keep(p.load, res, line=lambda row: _point_line(p, row))
                sweep_doc["points"][-1]["store_id"] = row
                write_output()

            console.print(f"sweep {sweep_id}" + (f" under {slos.describe()}" if slos else "")
                          + f" against {cfg.shown_url}", markup=False, highlight=False)
            result = run_sweep(measure, scfg, on_point)
            console.print(_sweep_table(result, slos))
            sweep_doc.update({"synchronous_req_s": result.synchronous_req_s,
                              "saturated_req_s": result.saturated_req_s,
                              "notes": list(result.notes),
                              "capacity": result.capacity.to_dict() if result.capacity else None})
            for n in result.notes:
                console.print(f"note: {n}", style="yellow")
            if result.capacity is not None:
                console.print(f"capacity: {result.capacity.describe()}", style="bold")
                for n in result.capacity.notes:
                    console.print(f"  {n}", markup=False, highlight=False)
            write_output()
        if st is not None:
            st.close()
        if as_json:
            from servelab import jsonout

            jsonout.emit("bench", {"provenance": provenance.collect(server_info=server_info,
                                                                   workload_seed=wl.seed),
                                   "load_points": out, "sweep": sweep_doc})
        if all(s["completed"] == 0 for s in out):
            raise typer.Exit(1)  # nothing was measured: let scripts notice
