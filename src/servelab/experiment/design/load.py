"""`[load]` and `[workload]` of an experiment file: the load points each arm is measured at (fixed
concurrencies, open-loop request rates, or a capacity sweep under SLOs: sweep.py), and the
requests of every run, as `servelab bench` takes them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from servelab.bench.config import (
    BenchConfig,
    SessionsConfig,
    ThinkTime,
    WorkloadConfig,
    min_warmup_s,
)
from servelab.errors import UserError
from servelab.experiment.design.base import Strict
from servelab.experiment.design.sweep import SWEEP_KEY, SweepSpec

# more streams than any client machine opens; a typo beyond it would fail at run time
MAX_CONCURRENCY = 1_000_000


class LoadSpec(Strict):
    concurrency: list[int] = []
    request_rate: list[float] = []
    burstiness: float = Field(1.0, gt=0)
    sweep: SweepSpec | None = None
    replay: bool = False  # one load point on the workload's own clock (a trace): key "replay"

    @field_validator("concurrency")
    @classmethod
    def _pos_c(cls, v: list[int]) -> list[int]:
        if any(not 1 <= c <= MAX_CONCURRENCY for c in v):
            raise ValueError(f"concurrency values must be between 1 and {MAX_CONCURRENCY:,}")
        return v

    @field_validator("request_rate")
    @classmethod
    def _pos_r(cls, v: list[float]) -> list[float]:
        if any(not r > 0 for r in v):    # NaN too: it compares false with everything
            raise ValueError("request rates must be numbers > 0 (requests per second; inf sends "
                             "all at once)")
        return v

    @model_validator(mode="after")
    def _some(self) -> LoadSpec:
        if not self.concurrency and not self.request_rate and self.sweep is None and not self.replay:
            raise ValueError(
                "give at least one load point: concurrency = [...], request_rate = [...], "
                'replay = true (a trace) or sweep = { slo = "ttft_p99_ms=2000" }'
            )
        return self

    def keys(self) -> list[tuple[str, int | None, float | None]]:
        """(load key, concurrency, rate) in file order; keys match bench's LoadPoint.key."""
        out: list[tuple[str, int | None, float | None]] = [
            (f"c={c}", c, None) for c in self.concurrency
        ]
        out += [(f"rate={r:g}", None, r) for r in self.request_rate]
        if self.replay:  # LoadPoint() with neither: every request at its own time
            out.append(("replay", None, None))
        if self.sweep is not None:  # one capacity search per run, after the fixed load points
            out.append((SWEEP_KEY, None, None))
        return out


class SharedPrefixSpec(Strict):
    """`[workload.shared_prefix]`: SGLang's generated-shared-prefix groups (--gsp-*)."""

    num_groups: int = Field(64, ge=1)
    prompts_per_group: int = Field(16, ge=1)
    system_prompt_len: int = Field(2048, ge=1)
    question_len: int = Field(128, ge=1)
    output_len: int = Field(256, ge=1)


class SessionsSpec(Strict):
    """`[workload.sessions]`: multi-turn sessions, as `servelab bench --num-sessions` (ShareGPT
    conversations when `dataset` is given, else synthetic `turns` x `input_len`); a load
    point's concurrency counts sessions in flight. `think_time`: "2", "exponential:2",
    "uniform:1-3" (seconds)."""

    num_sessions: int = Field(8, ge=1)
    turns: int = Field(4, ge=1)
    max_turns: int | None = Field(None, ge=1)
    think_time: str = "0"

    @field_validator("think_time")
    @classmethod
    def _think(cls, v: str) -> str:
        try:
            ThinkTime.parse(v)
        except UserError as exc:
            raise ValueError(str(exc).replace("--think-time", "think_time")) from None
        return v


class WorkloadSpec(Strict):
    """As `servelab bench`: request lengths, prompts per run, dataset, seed; or a trace
    (`trace = "file"`, `trace_speed`, `trace_start_s`, `trace_duration_s`, `trace_format`,
    `trace_block_size`; with `[load] replay = true` it runs on its own clock), or shared-prefix
    groups (`[workload.shared_prefix]`), or multi-turn sessions (`[workload.sessions]`).
    `warmup_until_steady` / `max_warmup_s`: as `servelab bench --warmup-until-steady`;
    `scrape_interval_s` as `--scrape-interval`."""

    input_len: int = Field(256, ge=1)
    output_len: int = Field(256, ge=1)
    num_prompts: int = Field(100, ge=1)
    dataset: str | None = None
    trace: str | None = None
    trace_format: Literal["mooncake", "bailian", "azure", "burstgpt"] | None = None
    trace_speed: float = Field(1.0, gt=0)
    trace_start_s: float = Field(0.0, ge=0)
    trace_duration_s: float | None = Field(None, gt=0)
    trace_block_size: int | None = Field(None, ge=1)
    shared_prefix: SharedPrefixSpec | None = None
    sessions: SessionsSpec | None = None
    seed: int = 0
    tokenizer: str | None = None
    api: Literal["completions", "chat", "sglang"] = "completions"
    warmup: int = Field(0, ge=0)
    # open-loop points (request_rate, a sweep's rates): warm up at the rate until steady, then
    # measure num_prompts (docs/METRICS.md "Warm-up until steady"); beside `warmup`, the other
    # warm-up, since both shape what each run sends
    warmup_until_steady: bool = False
    max_warmup_s: float = Field(60.0, gt=0)
    # the engine's /metrics scraped and the GPUs sampled every this many seconds over each
    # run's load (0: no telemetry), as `servelab bench --scrape-interval`
    scrape_interval_s: float = Field(1.0, ge=0, allow_inf_nan=False)
    max_duration_s: float | None = Field(None, gt=0)
    request_timeout_s: float = Field(600.0, gt=0)
    goodput: dict[str, float] = {}

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadSpec:
        given = [k for k in ("dataset", "trace", "shared_prefix") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of dataset, trace, shared_prefix; got {', '.join(given)}")
        if self.sessions is not None and (self.trace or self.shared_prefix):
            raise ValueError("sessions come from a ShareGPT dataset or are synthetic: drop "
                             "trace / shared_prefix")
        if self.warmup_until_steady and self.warmup:
            raise ValueError("warmup and warmup_until_steady are two warm-ups: give one")
        least = min_warmup_s()
        if self.warmup_until_steady and self.max_warmup_s < least:
            raise ValueError(f"max_warmup_s = {self.max_warmup_s:g} is shorter than the shortest "
                             f"warm-up that can end steady: give at least {least:g}")
        return self

    def bench_config(self, base_url: str, model: str | None = None) -> BenchConfig:
        """This workload as the servelab.bench configuration that measures it at `base_url`
        (BenchConfig runs the bench's own checks: dataset and tokenizer files, goodput keys)."""
        g = self.shared_prefix
        gsp = {} if g is None else {
            "gsp_num_groups": g.num_groups, "gsp_prompts_per_group": g.prompts_per_group,
            "gsp_system_prompt_len": g.system_prompt_len, "gsp_question_len": g.question_len,
            "gsp_output_len": g.output_len}
        name = "trace" if self.trace else "generated-shared-prefix" if g is not None else None
        ss = self.sessions
        sessions = None if ss is None else SessionsConfig(
            num_sessions=ss.num_sessions, turns=ss.turns, max_turns=ss.max_turns,
            think_time=ThinkTime.parse(ss.think_time))
        return BenchConfig(
            base_url=base_url,
            workload=WorkloadConfig(
                input_len=self.input_len,
                output_len=self.output_len,
                num_prompts=self.num_prompts,
                dataset=self.trace or self.dataset,
                seed=self.seed,
                tokenizer=self.tokenizer,
                dataset_name=name,
                trace_format=self.trace_format,
                trace_speed=self.trace_speed,
                trace_start_s=self.trace_start_s,
                trace_duration_s=self.trace_duration_s,
                trace_block_size=self.trace_block_size,
                sessions=sessions,
                **gsp,
            ),
            model=model,
            api=self.api,
            warmup=self.warmup,
            warmup_until_steady=self.warmup_until_steady,
            max_warmup_s=self.max_warmup_s,
            scrape_interval_s=self.scrape_interval_s,
            max_duration_s=self.max_duration_s,
            request_timeout_s=self.request_timeout_s,
            goodput=dict(self.goodput),
        )


# Keys added to the design after experiments were stored with a hash, by the last release
# that hashed designs without them: at their defaults they are left out of the design hash, so
# an experiment stored before them resumes instead of being refused as a different design
# (placement keys: design/placement.py drop_unset_placement). The canonical hash leaves out
# every group's keys at their defaults (the form of the first release, 04aadbd); a design
# stored by a later release carries that release's form (`legacy_forms`). A key added later
# goes into a new group named by the release before it.
ADDED_KEYS: tuple[tuple[str, dict[str, tuple[type[Strict], tuple[str, ...]]]], ...] = (
    ("04aadbd", {"load": (LoadSpec, ("replay",)),
                 "workload": (WorkloadSpec, ("trace", "trace_format", "trace_speed",
                                             "trace_start_s", "trace_duration_s",
                                             "trace_block_size", "shared_prefix", "sessions"))}),
    ("86dc756", {"workload": (WorkloadSpec, ("warmup_until_steady", "max_warmup_s",
                                             "scrape_interval_s"))}),
)


def drop_added_defaults(d: dict[str, Any], since: int = 0) -> None:
    """Leave out of a design's JSON (for its hash) the keys of ADDED_KEYS[since:] that are at
    their defaults (since = 0: every group, the canonical form)."""
    for _, groups in ADDED_KEYS[since:]:
        for section, (model, keys) in groups.items():
            sec = d.get(section)
            if not isinstance(sec, dict):
                continue
            for k in keys:
                if k in sec and sec[k] == model.model_fields[k].default:
                    sec.pop(k)


def legacy_forms() -> range:
    """The `since` of each later release's form: release ADDED_KEYS[i][0]'s successor hashed
    every key but those of groups i+1.. (1..len-1)."""
    return range(1, len(ADDED_KEYS))
