"""Typed configuration of one benchmark: the workload, the load point, and the run settings.

Each dataclass checks its own invariants in `__post_init__` and raises `UserError` with a message
that names the bad value and how to fix it, so the CLI and the experiment runner share one set of
checks.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from servelab.errors import UserError
from servelab.redaction import redact_url

APIS = ("completions", "chat", "sglang")
GOODPUT_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")
_KIND = {int: "an integer", float: "a number"}
# vLLM's --goodput keys (ttft, tpot, e2el) are accepted too
_GOODPUT_ALIASES = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms", "e2e": "e2e_ms",
                    "e2el_ms": "e2e_ms"}


# the longest warm-up until steady before a point is measured anyway (and called unsteady)
DEFAULT_MAX_WARMUP_S = 60.0
# the shortest trailing window the online steadiness test judges: a warm-up lasts at least
# twice that before it can be called steady (telemetry/steady.py `Online.check`)
DEFAULT_STEADY_WINDOW_S = 5.0


def min_warmup_s(steady_window_s: float = DEFAULT_STEADY_WINDOW_S) -> float:
    """The shortest warm-up until steady that can end steady: its trailing half must span
    `steady_window_s` (a cap below it makes every point unsteady, whatever its trends)."""
    return 2 * steady_window_s
DATASETS = ("random", "sharegpt", "trace", "generated-shared-prefix")
TRACE_FORMATS = ("mooncake", "bailian", "azure", "burstgpt")
THINK_KINDS = ("constant", "exponential", "uniform")
_THINK_HELP = "e.g. 2 (seconds, fixed), exponential:2 (mean 2 s) or uniform:1-3"


@dataclass(frozen=True, slots=True)
class ThinkTime:
    """The pause of a session between an answer and its next turn (seconds): `constant` (`low_s`
    every time), `exponential` (mean `low_s`: a user's memoryless pause) or `uniform` on
    [`low_s`, `high_s`]. Written `2`, `exponential:2`, `uniform:1-3` (`parse`)."""

    kind: str = "constant"
    low_s: float = 0.0
    high_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in THINK_KINDS:
            raise UserError(f"--think-time {self.kind!r}: the distribution is one of "
                            f"{', '.join(THINK_KINDS)}; {_THINK_HELP}")
        hi = self.high_s if self.high_s is not None else self.low_s
        if not (0 <= self.low_s <= hi and math.isfinite(hi)):
            raise UserError(f"--think-time {self}: seconds must be finite, >= 0 (and low <= "
                            f"high); {_THINK_HELP}")
        if (self.kind == "uniform") != (self.high_s is not None):
            raise UserError(f"--think-time {self}: uniform takes LOW-HIGH, the others one "
                            f"number; {_THINK_HELP}")

    def __str__(self) -> str:
        if self.kind == "uniform":
            hi = "?" if self.high_s is None else f"{self.high_s:g}"
            return f"uniform:{self.low_s:g}-{hi}"
        return f"{self.low_s:g}" if self.kind == "constant" else f"{self.kind}:{self.low_s:g}"

    @classmethod
    def parse(cls, text: str) -> ThinkTime:
        """`2`, `constant:2`, `exponential:2`, `uniform:1-3` (seconds)."""
        kind, _, val = text.strip().rpartition(":")
        kind = kind.strip().lower() or "constant"
        try:
            if kind == "uniform":
                lo, _, hi = val.partition("-")
                return cls(kind, float(lo), float(hi))
            return cls(kind, float(val))
        except ValueError:
            raise UserError(f"--think-time {text!r} is not a think time; {_THINK_HELP}") from None

    def draw(self, rng: random.Random) -> float:
        """One pause, in seconds."""
        if self.kind == "exponential":
            return rng.expovariate(1.0 / self.low_s) if self.low_s > 0 else 0.0
        if self.kind == "uniform":
            assert self.high_s is not None
            return rng.uniform(self.low_s, self.high_s)
        return self.low_s


@dataclass(frozen=True, slots=True)
class SessionsConfig:
    """Multi-turn sessions (servelab.bench.sessions): `num_sessions` conversations, each sending
    its turns one after the other, every turn with the history and the server's own earlier
    answers. From a ShareGPT file, its conversations (at most `max_turns` user turns each);
    without one, synthetic sessions of `turns` turns, each adding `input_len` tokens of new
    user text and asking `output_len` tokens. `think_time` passes between an answer and the
    next turn. A load point's concurrency counts sessions in flight; a request rate, session
    starts per second."""

    num_sessions: int = 8
    turns: int = 4
    max_turns: int | None = None
    think_time: ThinkTime = field(default_factory=ThinkTime)

    def __post_init__(self) -> None:
        if self.num_sessions < 1:
            raise UserError(f"--num-sessions must be >= 1, got {self.num_sessions}")
        if self.turns < 1:
            raise UserError(f"--turns must be >= 1, got {self.turns}")
        if self.max_turns is not None and self.max_turns < 1:
            raise UserError(f"--max-turns must be >= 1 user turns, got {self.max_turns}")


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """What to send (servelab.bench.datasets): fixed input/output lengths (exact when a tokenizer
    is at hand), a ShareGPT-format file, a replayed trace, or generated shared-prefix groups;
    `seed` makes the prompts and the arrival times reproducible. `dataset_name` None means
    'sharegpt' when a file is given, else 'random' (the behaviour before names existed).

    A trace (`dataset_name="trace"`, `dataset` its path): `trace_format` (None: detected),
    `trace_speed` (2.0 replays twice as fast), `trace_start_s` / `trace_duration_s` (the window,
    seconds after the file's first request), `trace_block_size` (tokens per hash id; None: the
    format's own, Mooncake 512, Bailian 16); `num_prompts` caps the requests.
    Shared-prefix groups: `gsp_*`, SGLang's flags and defaults. Multi-turn sessions:
    `sessions` (random or sharegpt; SessionsConfig)."""

    input_len: int = 256
    output_len: int = 256
    num_prompts: int = 100
    dataset: str | None = None
    seed: int = 0
    tokenizer: str | None = None
    dataset_name: str | None = None
    trace_format: str | None = None
    trace_speed: float = 1.0
    trace_start_s: float = 0.0
    trace_duration_s: float | None = None
    trace_block_size: int | None = None
    gsp_num_groups: int = 64
    gsp_prompts_per_group: int = 16
    gsp_system_prompt_len: int = 2048
    gsp_question_len: int = 128
    gsp_output_len: int = 256
    sessions: SessionsConfig | None = None

    @property
    def kind(self) -> str:
        """The dataset: random, sharegpt, trace or generated-shared-prefix."""
        return self.dataset_name or ("sharegpt" if self.dataset else "random")

    def __post_init__(self) -> None:
        self._check_kind()
        if self.input_len < 1:
            raise UserError(f"--input-len must be >= 1, got {self.input_len}")
        if self.output_len < 1:
            raise UserError(f"--output-len must be >= 1, got {self.output_len}")
        if self.num_prompts < 1:
            raise UserError(f"--num-prompts must be >= 1, got {self.num_prompts}")
        if self.seed < 0:  # numpy's generators (arrival times) take only non-negative seeds
            raise UserError(f"--seed must be >= 0, got {self.seed}")
        if self.dataset is not None and not Path(self.dataset).is_file():
            what = "a trace file" if self.kind == "trace" else "a ShareGPT-format JSON file"
            raise UserError(f"--dataset {self.dataset}: no such file; pass {what}")
        if self.tokenizer is not None and not Path(self.tokenizer).exists():
            raise UserError(
                f"--tokenizer {self.tokenizer}: no such file or folder; pass a tokenizer.json "
                "(HF tokenizers) or the folder that holds one"
            )


    def _check_kind(self) -> None:
        if self.kind not in DATASETS:
            raise UserError(f"--dataset-name {self.kind!r} is not one of {', '.join(DATASETS)}")
        if self.kind in ("sharegpt", "trace") and not self.dataset:
            raise UserError(f"--dataset-name {self.kind} needs --dataset-path FILE")
        if self.kind in ("random", "generated-shared-prefix") and self.dataset:
            raise UserError(f"--dataset-name {self.kind} takes no --dataset-path; for a file "
                            "use --dataset-name sharegpt or trace")
        if self.sessions is not None and self.kind not in ("random", "sharegpt"):
            raise UserError(f"multi-turn sessions (--num-sessions) come from a ShareGPT file or "
                            f"are synthetic (--dataset-name random), not {self.kind}")
        if self.trace_format is not None and self.trace_format not in TRACE_FORMATS:
            raise UserError(f"--trace-format {self.trace_format!r} is not one of "
                            f"{', '.join(TRACE_FORMATS)}")
        if not (self.trace_speed > 0 and math.isfinite(self.trace_speed)):
            raise UserError(f"--trace-speed must be a number > 0 (2 = twice as fast), got "
                            f"{self.trace_speed}")
        if not (self.trace_start_s >= 0 and math.isfinite(self.trace_start_s)):
            raise UserError(f"--trace-start must be >= 0 seconds, got {self.trace_start_s}")
        if self.trace_duration_s is not None and not self.trace_duration_s > 0:
            raise UserError(f"--trace-duration must be > 0 seconds, got {self.trace_duration_s}")
        if self.trace_block_size is not None and self.trace_block_size < 1:
            raise UserError(f"--trace-block-size must be >= 1 tokens, got {self.trace_block_size}")
        for flag, v in (("--gsp-num-groups", self.gsp_num_groups),
                        ("--gsp-prompts-per-group", self.gsp_prompts_per_group),
                        ("--gsp-system-prompt-len", self.gsp_system_prompt_len),
                        ("--gsp-question-len", self.gsp_question_len),
                        ("--gsp-output-len", self.gsp_output_len)):
            if v < 1:
                raise UserError(f"{flag} must be >= 1, got {v}")


@dataclass(frozen=True, slots=True)
class LoadPoint:
    """One load: closed loop with `concurrency` requests in flight, open loop at `request_rate`
    requests/s (Poisson when `burstiness` is 1, gamma otherwise; `inf` sends every request at
    once), or neither: a replay, every request at its own time (a trace's clock; key 'replay')."""

    concurrency: int | None = None
    request_rate: float | None = None
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.request_rate is not None:
            raise UserError("give one of --concurrency or --request-rate for a load point")
        if self.concurrency is not None and self.concurrency < 1:
            raise UserError(f"--concurrency must be >= 1, got {self.concurrency}")
        # inf: every request sent at once (SGLang's and vLLM's default, GuideLLM's "throughput")
        if self.request_rate is not None and not self.request_rate > 0:
            raise UserError(f"--request-rate must be > 0 requests/s (or inf: all at once), got "
                            f"{self.request_rate}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise UserError(f"--burstiness must be > 0 (1 = Poisson), got {self.burstiness}")

    @property
    def key(self) -> str:
        """`c=8`, `rate=4`, `rate=inf` or `replay` (the store's load_key)."""
        if self.concurrency is not None:
            return f"c={self.concurrency}"
        r = self.request_rate
        return "replay" if r is None else f"rate={r:g}"

    @property
    def replay(self) -> bool:
        """Every request at its own arrival time (the workload's clock)."""
        return self.concurrency is None and self.request_rate is None


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """Everything about a benchmark except the load point."""

    base_url: str
    workload: WorkloadConfig
    model: str | None = None
    api: str = "completions"
    warmup: int = 0
    max_duration_s: float | None = None
    request_timeout_s: float = 600.0
    goodput: dict[str, float] = field(default_factory=dict)
    # /metrics scrape and GPU sampling period over each load point (telemetry/); 0: off
    scrape_interval_s: float = 1.0
    # open-loop points at a finite rate: send at the rate from the start until the client sees
    # a steady state (at most max_warmup_s), measure the next num_prompts, cool down (load.py)
    warmup_until_steady: bool = False
    max_warmup_s: float = DEFAULT_MAX_WARMUP_S
    # the shortest trailing window the online test judges (the warm-up lasts twice that)
    steady_window_s: float = DEFAULT_STEADY_WINDOW_S

    def __post_init__(self) -> None:
        shown = self.shown_url
        if not (self.scrape_interval_s >= 0 and math.isfinite(self.scrape_interval_s)):
            raise UserError(f"--scrape-interval must be a finite number of seconds >= 0 (0: no "
                            f"telemetry), got {self.scrape_interval_s}")
        try:
            u = urlparse(self.base_url)
            u.port  # noqa: B018 (parses the port: ValueError when it is not a number)
        except ValueError:
            raise UserError(f"--base-url {shown!r} is not a valid URL; e.g. http://127.0.0.1:30000") from None
        if u.scheme not in ("http", "https") or not u.hostname:
            raise UserError(f"--base-url {shown!r} is not an http(s) URL; e.g. http://127.0.0.1:30000")
        if u.path not in ("", "/") and u.path.rstrip("/") != "/v1":
            raise UserError(f"--base-url {shown!r}: give the server root (no path), e.g. http://host:port")
        if u.query or u.fragment:
            raise UserError(f"--base-url {shown!r}: give the server root without a query string; "
                            "an API key goes in SERVELAB_API_KEY (sent as a bearer token)")
        if self.api not in APIS:
            raise UserError(f"--api {self.api!r} is not one of {', '.join(APIS)}")
        if self.warmup < 0:
            raise UserError(f"--warmup must be >= 0, got {self.warmup}")
        if not (self.max_warmup_s > 0 and math.isfinite(self.max_warmup_s)):
            raise UserError(f"--max-warmup-s must be a finite number of seconds > 0, got "
                            f"{self.max_warmup_s}")
        if not (self.steady_window_s > 0 and math.isfinite(self.steady_window_s)):
            raise UserError(f"steady_window_s must be a finite number of seconds > 0, got "
                            f"{self.steady_window_s}")
        if self.warmup_until_steady and self.warmup:
            raise UserError(f"--warmup {self.warmup} and --warmup-until-steady are two warm-ups: "
                            "give one (--warmup 0 with --warmup-until-steady)")
        # finite: both become integer deadlines (inf overflowed into a traceback)
        if self.max_duration_s is not None and not (self.max_duration_s > 0
                                                    and math.isfinite(self.max_duration_s)):
            raise UserError(f"--max-duration must be a finite number of seconds > 0 (leave it out "
                            f"for no cap), got {self.max_duration_s}")
        least = min_warmup_s(self.steady_window_s)
        if self.warmup_until_steady and self.max_warmup_s < least:
            raise UserError(f"--max-warmup-s {self.max_warmup_s:g} is shorter than the shortest "
                            f"warm-up that can end steady ({least:g} s, twice the steady window): give "
                            f"at least {least:g}")
        if (self.warmup_until_steady and self.max_duration_s is not None
                and self.max_duration_s <= least):
            raise UserError(f"--max-duration {self.max_duration_s:g} ends within the shortest "
                            f"warm-up until steady ({least:g} s), before any measured request: "
                            f"give more than {least:g} s, or drop --warmup-until-steady")
        if not (self.request_timeout_s > 0 and math.isfinite(self.request_timeout_s)):
            raise UserError(f"--request-timeout must be a finite number of seconds > 0, got "
                            f"{self.request_timeout_s}")
        for k, v in self.goodput.items():
            if k not in GOODPUT_KEYS:
                raise UserError(f"--goodput key {k!r} is not one of {', '.join(GOODPUT_KEYS)}")
            if not (isinstance(v, int | float) and v > 0 and math.isfinite(v)):
                raise UserError(f"--goodput {k}={v!r}: the SLO must be a number of milliseconds > 0")

    @property
    def root_url(self) -> str:
        """The server root without credentials, a trailing slash or `/v1`: what requests go to
        (the credentials travel as `basic_auth`)."""
        u = urlparse(self.base_url)
        netloc = u.hostname if ":" not in (u.hostname or "") else f"[{u.hostname}]"
        if u.port is not None:
            netloc = f"{netloc}:{u.port}"
        root = f"{u.scheme}://{netloc}{u.path}".rstrip("/")
        return root[: -len("/v1")] if root.endswith("/v1") else root

    @property
    def shown_url(self) -> str:
        """`base_url` as it may be stored and shown: credentials and secret query values hidden."""
        return redact_url(self.base_url)

    @property
    def basic_auth(self) -> tuple[str, str] | None:
        """The URL's `user:password@` credentials (percent-decoded), or None."""
        u = urlparse(self.base_url)
        if u.username is None:
            return None
        return unquote(u.username), unquote(u.password or "")


def split_pairs(text: str, flag: str, example: str) -> list[tuple[str, str]]:
    """`a=1,b=2`, `a:1 b:2` (vLLM's `--goodput ttft:500 tpot:50`, quoted) -> [(a, 1), (b, 2)]."""
    out: list[tuple[str, str]] = []
    for part in re.split(r"[,\s]+", text.strip()):
        if not part:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_]+)\s*[=:]\s*(.+)", part)
        if m is None:
            raise UserError(f"{flag} {part!r}: write KEY=VALUE (or KEY:VALUE), e.g. {example}")
        out.append((m.group(1).lower(), m.group(2)))
    return out


def parse_goodput(text: str | None) -> dict[str, float]:
    """`ttft_ms=500,tpot_ms=50` -> {"ttft_ms": 500.0, "tpot_ms": 50.0}; vLLM's spelling
    `ttft:500 tpot:50` (names `ttft`, `tpot`, `e2el`) is accepted too."""
    out: dict[str, float] = {}
    if not text:
        return out
    for k, v in split_pairs(text, "--goodput", "ttft_ms=500,tpot_ms=50 or 'ttft:500 tpot:50'"):
        key = _GOODPUT_ALIASES.get(k, k)
        try:
            out[key] = float(v)
        except ValueError:
            raise UserError(f"--goodput {k}={v}: {v!r} is not a number of milliseconds") from None
    return out


def parse_list(text: str, kind: type, flag: str) -> list:
    """`1,8,16` -> [1, 8, 16] with a one-line error naming the flag on bad input."""
    vals = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            vals.append(kind(part))
        except ValueError:
            raise UserError(f"{flag} {text!r}: {part!r} is not {_KIND[kind]}") from None
    if not vals:
        raise UserError(f"{flag} needs at least one value, e.g. {flag} 1,8,16")
    return vals


def parse_number(text: str | None, kind: type, flag: str) -> int | float | None:
    """A CLI number given as text, with a one-line error naming the flag on bad input."""
    if text is None:
        return None
    try:
        return kind(text)
    except ValueError:
        raise UserError(f"{flag} {text!r} is not {_KIND[kind]}") from None
