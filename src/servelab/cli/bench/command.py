"""CLI verb: `servelab bench` - measure one running server under load, one load point per
concurrency or request rate, or a capacity sweep (`--sweep --slo ...`). Thin: the flags
(options.py) become one BenchArgs; run.py builds the typed configs and calls servelab.bench.run
(and servelab.bench.sweep).

Flag names follow servelab's own vocabulary; SGLang's `bench_serving` and vLLM's `bench serve`
spellings are accepted as aliases (`--max-concurrency`, `--num-warmups` / `--warmup-requests`,
`--output-file`, `--random-input-len`,
`--random-output-len`, `--dataset-path`, `--goodput ttft:500`), so a command line copied from
them runs here. `--save-result` (with `--result-dir`, `--result-filename`, `--save-detailed`,
`--append-result`, `--metadata`, `--percentile-metrics`, `--metric-percentiles`) writes vLLM's
own result file beside servelab's `--output`.
"""

from __future__ import annotations

import typer

from servelab.cli.bench import options as o
from servelab.cli.bench.options import BenchArgs


def register(app: typer.Typer) -> None:
    """Add `bench` to the app."""

    @app.command("bench")
    def bench(
        base_url: str = o.BASE_URL,
        model: str = o.MODEL,
        api: str = o.API,
        concurrency: str = o.CONCURRENCY,
        request_rate: str = o.REQUEST_RATE,
        burstiness: str = o.BURSTINESS,
        num_prompts: str = o.NUM_PROMPTS,
        input_len: str = o.INPUT_LEN,
        output_len: str = o.OUTPUT_LEN,
        dataset: str = o.DATASET,
        dataset_name: str = o.DATASET_NAME,
        trace_format: str = o.TRACE_FORMAT,
        trace_speed: str = o.TRACE_SPEED,
        trace_start: str = o.TRACE_START,
        trace_duration: str = o.TRACE_DURATION,
        trace_block_size: str = o.TRACE_BLOCK_SIZE,
        gsp_num_groups: str = o.GSP_NUM_GROUPS,
        gsp_prompts_per_group: str = o.GSP_PROMPTS_PER_GROUP,
        gsp_system_prompt_len: str = o.GSP_SYSTEM_PROMPT_LEN,
        gsp_question_len: str = o.GSP_QUESTION_LEN,
        gsp_output_len: str = o.GSP_OUTPUT_LEN,
        num_sessions: str = o.NUM_SESSIONS,
        turns: str = o.TURNS,
        max_turns: str = o.MAX_TURNS,
        think_time: str = o.THINK_TIME,
        seed: str = o.SEED,
        warmup: str = o.WARMUP,
        warmup_until_steady: bool = o.WARMUP_UNTIL_STEADY,
        max_warmup_s: str = o.MAX_WARMUP_S,
        max_duration: str = o.MAX_DURATION,
        goodput: str = o.GOODPUT,
        tokenizer: str = o.TOKENIZER,
        request_timeout: str = o.REQUEST_TIMEOUT,
        output: str = o.OUTPUT,
        save_result: bool = o.SAVE_RESULT,
        result_dir: str = o.RESULT_DIR,
        result_filename: str = o.RESULT_FILENAME,
        save_detailed: bool = o.SAVE_DETAILED,
        append_result: bool = o.APPEND_RESULT,
        metadata: list[str] = o.METADATA,
        percentile_metrics: str = o.PERCENTILE_METRICS,
        metric_percentiles: str = o.METRIC_PERCENTILES,
        sweep: bool = o.SWEEP,
        slo: str = o.SLO,
        sweep_precision: str = o.SWEEP_PRECISION,
        sweep_rates: str = o.SWEEP_RATES,
        sweep_max_points: str = o.SWEEP_MAX_POINTS,
        scrape_interval: str = o.SCRAPE_INTERVAL,
        store: str = o.STORE,
        label: str = o.LABEL,
        no_store: bool = o.NO_STORE,
        quiet: bool = o.QUIET,
        as_json: bool = o.AS_JSON,
    ) -> None:
        """Measure a running OpenAI-compatible or SGLang server under load: at the load points
        given, or a capacity sweep under SLOs (--sweep --slo ttft_p99_ms=2000,tpot_p99_ms=50).
        A trace (--dataset-name trace --dataset-path FILE) replays on its own clock unless
        --concurrency or --request-rate is given.

        Sends `Authorization: Bearer $SERVELAB_API_KEY` (or $OPENAI_API_KEY) when set.
        """
        # run.py loads aiohttp and numpy (~0.4 s): only when bench runs, not at every CLI start
        from servelab.cli.bench.run import execute

        execute(BenchArgs(
            base_url=base_url, model=model, api=api, concurrency=concurrency,
            request_rate=request_rate, burstiness=burstiness, num_prompts=num_prompts,
            input_len=input_len, output_len=output_len, dataset=dataset, seed=seed, warmup=warmup,
            max_duration=max_duration, goodput=goodput, tokenizer=tokenizer,
            request_timeout=request_timeout, output=output, save_result=save_result,
            result_dir=result_dir, result_filename=result_filename, sweep=sweep, slo=slo,
            sweep_precision=sweep_precision, sweep_rates=sweep_rates,
            sweep_max_points=sweep_max_points, store=store, label=label, no_store=no_store,
            quiet=quiet, as_json=as_json, dataset_name=dataset_name, trace_format=trace_format,
            trace_speed=trace_speed, trace_start=trace_start, trace_duration=trace_duration,
            trace_block_size=trace_block_size, gsp_num_groups=gsp_num_groups,
            gsp_prompts_per_group=gsp_prompts_per_group,
            gsp_system_prompt_len=gsp_system_prompt_len, gsp_question_len=gsp_question_len,
            gsp_output_len=gsp_output_len, num_sessions=num_sessions, turns=turns,
            max_turns=max_turns, think_time=think_time, scrape_interval=scrape_interval,
            save_detailed=save_detailed, append_result=append_result, metadata=metadata,
            percentile_metrics=percentile_metrics, metric_percentiles=metric_percentiles,
            warmup_until_steady=warmup_until_steady, max_warmup_s=max_warmup_s,
        ))
