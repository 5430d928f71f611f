"""The flags of `servelab bench`, one typer.Option each, and the raw values of a call.

The values stay text here: plan.py parses them (servelab.bench.config), so that a bad value
gives servelab's one-line `error: ...` (exit 2), not a usage box.
"""

from __future__ import annotations

from dataclasses import dataclass

import typer

from servelab.cli.results import STORE_HELP

BASE_URL = typer.Option(None, "--base-url", help="Server root, e.g. http://127.0.0.1:30000.")
MODEL = typer.Option(None, "--model", help="Model name (default: the first of /v1/models).")
API = typer.Option("completions", "--api", help="completions | chat | sglang (/generate).")
CONCURRENCY = typer.Option(None, "--concurrency", "--max-concurrency",
                           "--max-active-conversations",
                           help="Closed loop: in-flight requests, e.g. 1,8,16 (with "
                           "--num-sessions: sessions in flight).")
REQUEST_RATE = typer.Option(None, "--request-rate",
                            help="Open loop: requests/s, e.g. 4,8; inf: all at once.")
BURSTINESS = typer.Option("1.0", "--burstiness", help="Gamma shape of arrivals (1 = Poisson).")
NUM_PROMPTS = typer.Option("100", "--num-prompts", help="Measured requests per load point.")
INPUT_LEN = typer.Option("256", "--input-len", "--random-input-len",
                         help="Prompt tokens (exact with /tokenize or --tokenizer).")
OUTPUT_LEN = typer.Option("256", "--output-len", "--random-output-len",
                          help="Output tokens (max_tokens + ignore_eos).")
DATASET = typer.Option(None, "--dataset", "--dataset-path",
                       help="A ShareGPT-format JSON file, or with --dataset-name trace a trace.")
DATASET_NAME = typer.Option(None, "--dataset-name", help="random | sharegpt | trace | "
                            "generated-shared-prefix (default: sharegpt with a file, else random).")
TRACE_FORMAT = typer.Option(None, "--trace-format", help="mooncake | bailian | azure | burstgpt "
                            "(default: detected from the file).")
TRACE_SPEED = typer.Option("1.0", "--trace-speed", help="Replay speed: 2 = twice as fast.")
TRACE_START = typer.Option("0", "--trace-start", help="Skip the trace's first S seconds.")
TRACE_DURATION = typer.Option(None, "--trace-duration", help="Replay S seconds of the trace "
                              "(with --num-prompts as a cap on the requests).")
TRACE_BLOCK_SIZE = typer.Option(None, "--trace-block-size", help="Tokens per hash id (default: "
                                "Mooncake 512, Bailian 16).")
GSP_NUM_GROUPS = typer.Option("64", "--gsp-num-groups", help="Shared-prefix groups (G).")
GSP_PROMPTS_PER_GROUP = typer.Option("16", "--gsp-prompts-per-group", help="Prompts per group (P).")
GSP_SYSTEM_PROMPT_LEN = typer.Option("2048", "--gsp-system-prompt-len",
                                     help="Tokens of each group's shared system prompt (S).")
GSP_QUESTION_LEN = typer.Option("128", "--gsp-question-len", help="Tokens of each question (Q).")
GSP_OUTPUT_LEN = typer.Option("256", "--gsp-output-len", help="Output tokens of each request.")
NUM_SESSIONS = typer.Option(None, "--num-sessions", "--conversation-num",
                            "--num-conversations", help="Multi-turn: this many sessions, each "
                            "turn resending the history and the server's answers (ShareGPT "
                            "conversations with a file, else synthetic: --turns x --input-len).")
TURNS = typer.Option("4", "--turns", help="Multi-turn, synthetic: turns per session.")
MAX_TURNS = typer.Option(None, "--max-turns", help="Multi-turn: at most N user turns per "
                         "session (vLLM's --max-turns counts both roles: its 6 is our 3).")
THINK_TIME = typer.Option("0", "--think-time", help="Multi-turn: seconds between an answer and "
                          "the next turn: 2, exponential:2 (mean) or uniform:1-3.")
SEED = typer.Option("0", "--seed", help="Seed of prompts and arrival times.")
WARMUP = typer.Option("0", "--warmup", "--num-warmups", "--warmup-requests",
                      help="Requests sent first and excluded from the metrics.")
WARMUP_UNTIL_STEADY = typer.Option(
    None, "--warmup-until-steady/--no-warmup-until-steady",
    help="Open-loop rates: send at the rate until the client sees a steady state (at most "
    "--max-warmup-s), then measure the next --num-prompts requests, then cool down "
    "(docs/METRICS.md). Default: off (a --sweep's points too, unless given).")
MAX_WARMUP_S = typer.Option(None, "--max-warmup-s", help="With --warmup-until-steady: the "
                            "longest warm-up, at least 10 s (default 60); past it the point is "
                            "measured and called unsteady.")
MAX_DURATION = typer.Option(None, "--max-duration", help="Stop issuing requests after S seconds.")
GOODPUT = typer.Option(None, "--goodput", help="Per-request SLOs in ms for goodput, e.g. "
                       "ttft_ms=500,tpot_ms=50 or 'ttft:500 tpot:50 e2el:20000'.")
TOKENIZER = typer.Option(None, "--tokenizer", help="HF tokenizers file/folder for exact lengths.")
REQUEST_TIMEOUT = typer.Option("600", "--request-timeout",
                               help="Seconds before a request counts as failed.")
OUTPUT = typer.Option(None, "--output", "--output-file",
                      help="Write all load points (and provenance) to this JSON file.")
SAVE_RESULT = typer.Option(False, "--save-result", help="Also write vLLM's result JSON "
                           "(its keys and units) to --result-dir/--result-filename, one file "
                           "per load point (docs/METRICS.md).")
RESULT_DIR = typer.Option(None, "--result-dir", help="With --save-result: folder (default .).")
RESULT_FILENAME = typer.Option(None, "--result-filename", help="With --save-result: file name "
                               "(default vLLM's {label|backend}-{rate}qps[-concurrency{C}]-"
                               "{model}-{date}.json).")
SAVE_DETAILED = typer.Option(False, "--save-detailed", help="With --save-result: add vLLM's "
                             "per-request lists (ttfts, itls, input_lens, output_lens, ...).")
APPEND_RESULT = typer.Option(False, "--append-result", help="Save as --save-result, adding one "
                             "line per result to the file (vLLM's append layout).")
METADATA = typer.Option(None, "--metadata", help="With --save-result: KEY=VALUE written into "
                        "the result (repeat the flag, or quote several: 'tp=1 version=x').")
PERCENTILE_METRICS = typer.Option(None, "--percentile-metrics", help="With --save-result: "
                                  "metrics given mean/median/std/percentiles: ttft,tpot,itl "
                                  "(default, as vLLM), e2el, client_queue_time.")
METRIC_PERCENTILES = typer.Option("99", "--metric-percentiles", help="With --save-result: "
                                  "percentiles written, e.g. 50,90,99.")
SWEEP = typer.Option(False, "--sweep", help="Capacity sweep: synchronous, saturated, "
                     "then rates between, refined where --slo is crossed.")
SLO = typer.Option(None, "--slo", help="SLOs of the sweep, e.g. ttft_p99_ms=2000,"
                   "tpot_p99_ms=50, or per request 'ttft:500 tpot:50' (docs/METRICS.md).")
SWEEP_PRECISION = typer.Option("0.1", "--sweep-precision", help="Stop when the capacity "
                               "bracket is this narrow, relative (0.1 = 10%).")
SWEEP_RATES = typer.Option("3", "--sweep-rates", help="Open-loop rates evenly spaced "
                           "between the synchronous and saturated ones.")
SWEEP_MAX_POINTS = typer.Option("12", "--sweep-max-points", help="At most this many "
                                "load points in a sweep, all included.")
SCRAPE_INTERVAL = typer.Option("1", "--scrape-interval", help="Seconds between /metrics scrapes "
                               "and GPU samples over each load point (0: no telemetry).")
STORE = typer.Option(None, "--store", help=STORE_HELP)
LABEL = typer.Option(None, "--label", help="A name for these rows in the store.")
NO_STORE = typer.Option(False, "--no-store", help="Do not write to the results store.")
QUIET = typer.Option(False, "--quiet", help="No live progress.")
AS_JSON = typer.Option(False, "--json", help="Print every load point (and the sweep) "
                       "as one JSON document on stdout; tables go to stderr.")


@dataclass(frozen=True, slots=True)
class BenchArgs:
    """One `servelab bench` command line, as typed (numbers as text)."""

    base_url: str | None
    model: str | None
    api: str
    concurrency: str | None
    request_rate: str | None
    burstiness: str
    num_prompts: str
    input_len: str
    output_len: str
    dataset: str | None
    seed: str
    warmup: str
    max_duration: str | None
    goodput: str | None
    tokenizer: str | None
    request_timeout: str
    output: str | None
    save_result: bool
    result_dir: str | None
    result_filename: str | None
    sweep: bool
    slo: str | None
    sweep_precision: str
    sweep_rates: str
    sweep_max_points: str
    store: str | None
    label: str | None
    no_store: bool
    quiet: bool
    as_json: bool
    # the workload's dataset (no defaults here: the options above hold them)
    dataset_name: str | None
    trace_format: str | None
    trace_speed: str
    trace_start: str
    trace_duration: str | None
    trace_block_size: str | None
    gsp_num_groups: str
    gsp_prompts_per_group: str
    gsp_system_prompt_len: str
    gsp_question_len: str
    gsp_output_len: str
    # multi-turn sessions (defaults: None = single-turn requests)
    num_sessions: str | None = None
    turns: str = "4"
    max_turns: str | None = None
    think_time: str = "0"
    scrape_interval: str = "1"
    # vLLM's result file (--save-result) and what shapes it
    save_detailed: bool = False
    append_result: bool = False
    metadata: list[str] | None = None
    percentile_metrics: str | None = None
    metric_percentiles: str = "99"
    warmup_until_steady: bool | None = None  # None: the default of the mode (plan.py)
    max_warmup_s: str | None = None  # None: not given (DEFAULT_MAX_WARMUP_S)
