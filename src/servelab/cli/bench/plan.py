"""A `servelab bench` command line parsed into typed configs, checked before any load is sent.

Numbers arrive as text and are parsed by servelab.bench.config, so that a bad value gives the
one-line `error: ...` of servelab.errors.UserError (exit 2), not a usage box.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from servelab.bench.config import (
    DEFAULT_MAX_WARMUP_S,
    BenchConfig,
    LoadPoint,
    SessionsConfig,
    ThinkTime,
    WorkloadConfig,
    parse_goodput,
    parse_list,
    parse_number,
)
from servelab.bench.importers.vllm_layout import (
    VllmResultConfig,
    parse_metadata,
    parse_percentile_metrics,
    parse_percentiles,
)
from servelab.bench.slo import SloSet, parse_slo
from servelab.bench.sweep import SweepConfig
from servelab.cli.bench.options import BenchArgs
from servelab.errors import UserError


@dataclass(frozen=True, slots=True)
class Plan:
    """What one bench call measures: the load points given, or a sweep (then `loads` is
    empty), and where the JSON document goes."""

    cfg: BenchConfig
    loads: list[LoadPoint]
    sweep: SweepConfig | None
    slos: SloSet | None
    output: str | None
    vllm: VllmResultConfig | None = None  # --save-result: vLLM's layout, one file per point


def make_plan(a: BenchArgs) -> Plan:
    """Parse and check the command line, in the order its errors are reported."""
    if not a.base_url:
        raise UserError("--base-url is required, e.g. --base-url http://127.0.0.1:30000")
    b = parse_number(a.burstiness, float, "--burstiness")
    if a.sweep and a.num_sessions is not None:
        raise UserError("--sweep's rates are requests/s and sessions start at a rate of "
                        "sessions/s: measure sessions at --concurrency (sessions in flight) or "
                        "--request-rate (session starts/s) load points")
    slos = parse_slo(a.slo)
    scfg = None
    if a.sweep:
        if a.concurrency is not None or a.request_rate is not None:
            raise UserError("--sweep chooses its own load points: drop --concurrency / "
                            "--request-rate")
        scfg = SweepConfig(slo=slos,
                           precision=parse_number(a.sweep_precision, float, "--sweep-precision"),
                           grid_rates=parse_number(a.sweep_rates, int, "--sweep-rates"),
                           max_points=parse_number(a.sweep_max_points, int, "--sweep-max-points"),
                           burstiness=b)
        loads = []
    else:
        if slos is not None:
            raise UserError("--slo sets the objectives of a capacity sweep: add --sweep (for "
                            "goodput at given load points use --goodput)")
        replay = a.dataset_name == "trace" and a.concurrency is None and a.request_rate is None
        loads = [LoadPoint()] if replay else load_points(a.concurrency, a.request_rate, b)
    gp = parse_goodput(a.goodput)
    if slos is not None:
        if gp and slos.per_request and gp != slos.per_request:
            raise UserError("the per-request SLOs of --slo and --goodput differ: give them once, "
                            "in --slo")
        gp = gp or slos.goodput()
    wl = WorkloadConfig(
        input_len=parse_number(a.input_len, int, "--input-len"),
        output_len=parse_number(a.output_len, int, "--output-len"),
        num_prompts=parse_number(a.num_prompts, int, "--num-prompts"),
        dataset=a.dataset, seed=parse_number(a.seed, int, "--seed"), tokenizer=a.tokenizer,
        dataset_name=a.dataset_name, trace_format=a.trace_format,
        trace_speed=parse_number(a.trace_speed, float, "--trace-speed"),
        trace_start_s=parse_number(a.trace_start, float, "--trace-start"),
        trace_duration_s=parse_number(a.trace_duration, float, "--trace-duration"),
        trace_block_size=parse_number(a.trace_block_size, int, "--trace-block-size"),
        gsp_num_groups=parse_number(a.gsp_num_groups, int, "--gsp-num-groups"),
        gsp_prompts_per_group=parse_number(a.gsp_prompts_per_group, int, "--gsp-prompts-per-group"),
        gsp_system_prompt_len=parse_number(a.gsp_system_prompt_len, int, "--gsp-system-prompt-len"),
        gsp_question_len=parse_number(a.gsp_question_len, int, "--gsp-question-len"),
        gsp_output_len=parse_number(a.gsp_output_len, int, "--gsp-output-len"),
        sessions=sessions_config(a),
    )
    cfg = BenchConfig(
        base_url=a.base_url, workload=wl, model=a.model, api=a.api,
        warmup=parse_number(a.warmup, int, "--warmup"),
        max_duration_s=parse_number(a.max_duration, float, "--max-duration"),
        request_timeout_s=parse_number(a.request_timeout, float, "--request-timeout"),
        goodput=gp, scrape_interval_s=parse_number(a.scrape_interval, float, "--scrape-interval"),
        **steady_options(a, loads),
    )
    vllm = result_path(a, several=scfg is not None or len(loads) > 1)
    if a.output:
        check_output(a.output)
    if vllm is not None:
        check_folder(vllm.folder())
    return Plan(cfg=cfg, loads=loads, sweep=scfg, slos=slos, output=a.output, vllm=vllm)


def steady_options(a: BenchArgs, loads: list[LoadPoint]) -> dict[str, object]:
    """--warmup-until-steady (off unless given: on the scripted server's sweep it brackets
    the capacity as the default does and takes 87 s instead of 36, docs/performance.md) and
    --max-warmup-s (only with it: alone it would change nothing)."""
    on = a.warmup_until_steady
    if a.max_warmup_s is not None and not on:
        raise UserError("--max-warmup-s caps the warm-up of --warmup-until-steady: add "
                        "--warmup-until-steady, or drop --max-warmup-s")
    cap = (DEFAULT_MAX_WARMUP_S if a.max_warmup_s is None
           else parse_number(a.max_warmup_s, float, "--max-warmup-s"))
    if on and (a.num_sessions is not None or any(
            lp.request_rate is None or math.isinf(lp.request_rate) for lp in loads)):
        raise UserError("--warmup-until-steady warms up open-loop points at a finite "
                        "--request-rate (e.g. --request-rate 4,8): drop it for --concurrency, "
                        "inf, a replay or sessions")
    return {"warmup_until_steady": bool(on), "max_warmup_s": cap}


def sessions_config(a: BenchArgs) -> SessionsConfig | None:
    """Multi-turn sessions when --num-sessions is given; their other flags need it."""
    if a.num_sessions is None:
        if a.max_turns is not None or a.turns != "4" or a.think_time != "0":
            raise UserError("--turns, --max-turns and --think-time shape multi-turn sessions: "
                            "add --num-sessions N")
        return None
    return SessionsConfig(num_sessions=parse_number(a.num_sessions, int, "--num-sessions"),
                          turns=parse_number(a.turns, int, "--turns"),
                          max_turns=parse_number(a.max_turns, int, "--max-turns"),
                          think_time=ThinkTime.parse(a.think_time))


def load_points(concurrency: str | None, request_rate: str | None,
                burstiness: float) -> list[LoadPoint]:
    """The load points asked for. vLLM's `--request-rate inf --max-concurrency C` (every request
    released at once, at most C in flight) is a closed loop at C, and is taken as one."""
    rates = parse_list(request_rate, float, "--request-rate") if request_rate is not None else None
    if concurrency is not None:
        if rates is not None and not all(math.isinf(r) for r in rates):
            raise UserError("--concurrency (--max-concurrency) with a finite --request-rate (a rate "
                            "capped by a concurrency) is not supported: servelab measures a closed "
                            "loop (--concurrency) or an open loop (--request-rate); drop one")
        return [LoadPoint(concurrency=c) for c in parse_list(concurrency, int, "--concurrency")]
    if rates is None:
        raise UserError("give --concurrency (e.g. 1,8,16), --request-rate (e.g. 4,8 or inf) or "
                        "--sweep (a trace, --dataset-name trace, replays on its own clock)")
    return [LoadPoint(request_rate=r, burstiness=burstiness) for r in rates]


def result_path(a: BenchArgs, several: bool) -> VllmResultConfig | None:
    """vLLM's --save-result / --append-result [--result-dir D] [--result-filename F] and the flags
    that shape that file; --output is servelab's own document, beside it or alone."""
    if not (a.save_result or a.append_result):
        given = [f for f, v in (("--result-dir", a.result_dir),
                                ("--result-filename", a.result_filename),
                                ("--save-detailed", a.save_detailed), ("--metadata", a.metadata),
                                ("--percentile-metrics", a.percentile_metrics),
                                ("--metric-percentiles", a.metric_percentiles != "99")) if v]
        if given:
            raise UserError(f"{' / '.join(given)} take effect with --save-result (vLLM's result "
                            "file); add --save-result")
        return None
    return VllmResultConfig(
        result_dir=a.result_dir, result_filename=a.result_filename, detailed=a.save_detailed,
        append=a.append_result, metadata=parse_metadata(a.metadata),
        percentile_metrics=parse_percentile_metrics(a.percentile_metrics),
        percentiles=parse_percentiles(a.metric_percentiles), several_points=several)


def check_folder(folder: Path) -> None:
    """Refuse a --result-dir that cannot be written before any load is sent."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".servelab-", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UserError(f"--result-dir {folder}: cannot write there ({exc.strerror}); give a "
                        "folder you can write") from None


def check_output(path: str) -> None:
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
