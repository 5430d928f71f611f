"""The experiment file (TOML) as a typed model, validated with pydantic.

A bad file gives ONE line naming the key and the problem (design/parse.py); pre-flight checks
(unknown flags per engine, conflicting flags, recipe constraints) run before anything launches
(experiment/plan/preflight.py).
The full format, with an example, is documented in docs/EXPERIMENTS.md.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

import orjson
from pydantic import (
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from servelab import engines
from servelab.engines.base import FlagValue
from servelab.engines.launcher import Launcher
from servelab.experiment.design.base import Strict, is_stored
from servelab.experiment.design.load import (
    LoadSpec,
    WorkloadSpec,
    drop_added_defaults,
    legacy_forms,
)
from servelab.experiment.design.metrics import METRICS
from servelab.experiment.design.placement import (
    RayAsks,
    Where,
    check_placement,
    drop_unset_placement,
)
from servelab.redaction import redact

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"


class LauncherSpec(Strict):
    """Where the engine lives (engines/launcher.py): its interpreter, its executable, or a
    container command prefix; `version` picks the generated flag table when the engine
    cannot be imported there (default: the newest table)."""

    python: str | None = None
    executable: str | None = None
    container: list[str] = []
    version: str | None = None

    def launcher(self) -> Launcher:
        return Launcher(self.python, self.executable, tuple(self.container))


class ProcessSpec(RayAsks):
    """One process of a multi-process deployment (disaggregated: prefill, decode, router), and
    with `placement = "ray"` what it asks of the Ray node it runs on (RayAsks)."""

    role: Literal["server", "prefill", "decode", "router"]
    flags: dict[str, FlagValue] = {}
    env: dict[str, str] = {}
    port: int | None = Field(None, ge=1, le=65535)
    command: list[str] | None = None  # engine 'command' only
    launcher: LauncherSpec | None = None  # default: base.launcher


class BaseSpec(Strict):
    flags: dict[str, FlagValue] = {}
    env: dict[str, str] = {}
    processes: list[ProcessSpec] | None = None
    check_flags: bool = True  # false: no parser or table judges the flags (rules still apply)
    launcher: LauncherSpec = LauncherSpec()


class ArmSpec(Strict):
    """A named delta over the base: recipe(s) first, then flags set, then flags removed."""

    description: str = ""
    recipe: str | list[str] | None = None
    flags: dict[str, FlagValue] = {}
    remove: list[str] = []
    env: dict[str, str] = {}
    roles: list[Literal["server", "prefill", "decode", "router"]] | None = None
    placement: Where | None = None  # where the processes the delta applies to run

    @property
    def recipes(self) -> list[str]:
        if self.recipe is None:
            return []
        return [self.recipe] if isinstance(self.recipe, str) else list(self.recipe)


class Timeouts(Strict):
    ready_s: float = Field(900.0, gt=0)  # launch -> health 200
    teardown_s: float = Field(30.0, gt=0)  # SIGTERM -> SIGKILL grace
    port_free_s: float = Field(60.0, gt=0)
    gpu_free_s: float = Field(120.0, gt=0)


MAX_REPETITIONS = 1000  # a bound, so that a typo (99999999999999) is an error, not a hang
MAX_NAME = 100  # the name is a folder and file name (logs, job files, reports)


class AdaptiveSpec(Strict):
    """`repetitions = "auto"`: blocks run until every primary effect is decided (its always-valid
    interval wholly beyond or wholly inside the noise band) or the budget is spent."""

    # the rule is calibrated by simulating max blocks: 100 keeps that to seconds
    min: int = Field(5, ge=3, le=100, strict=True)  # blocks before the first look
    max: int = Field(20, ge=3, le=100, strict=True)  # blocks at most
    budget_s: float = Field(3600.0, gt=0, le=7 * 86400, allow_inf_nan=False)  # wall time
    alpha: float = Field(0.05, gt=0, le=0.2, allow_inf_nan=False)  # familywise error rate
    # how the looks' levels run: one constant level, or strict early and loose late looks
    boundary: Literal["pocock", "obrien-fleming"] = "pocock"
    # the load points whose effects are primary (decide when to stop, share alpha); None: all
    primary: list[str] | None = None

    @model_validator(mode="after")
    def _order(self) -> AdaptiveSpec:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        if self.primary is not None:
            if not self.primary:
                raise ValueError("primary must name at least one load point (or be left out)")
            if len(set(self.primary)) != len(self.primary):
                raise ValueError(f"primary names a load point twice: {self.primary}")
        return self


class NoiseSpec(Strict):
    """Noise control: core pinning, and what to do with a block the machine disturbed."""

    # 'auto': pin the client and each engine to disjoint cores when there are enough of them
    pin: StrictBool | Literal["auto"] = "auto"
    max_other_cpu: float | None = Field(None, ge=0, le=4096, allow_inf_nan=False)  # cores
    max_steal: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)  # fraction of CPU
    on_interference: Literal["record", "pause", "repeat"] = "record"
    max_repeats: int = Field(2, ge=0, le=100, strict=True)  # extra blocks for 'repeat'
    pause_s: float = Field(60.0, gt=0, le=3600, allow_inf_nan=False)  # longest wait for 'pause'


class ExperimentSpec(Strict):
    name: str = Field(pattern=_NAME, max_length=MAX_NAME)
    hypothesis: str = ""
    engine: str
    model: str = ""
    url: str | None = None  # engine 'external'
    command: list[str] | None = None  # engine 'command': argv with {host} {port}
    host: str = "127.0.0.1"
    placement: Where = "local"  # "ray": processes run on a Ray cluster's nodes
    ray_address: str | None = None  # "auto", "ray://host:port", "host:port"; unset: as ray.init()
    base: BaseSpec = BaseSpec()
    arms: dict[str, ArmSpec]
    baseline: str | None = None
    load: LoadSpec
    workload: WorkloadSpec = WorkloadSpec()
    repetitions: StrictInt | Literal["auto"] = 3
    adaptive: AdaptiveSpec = AdaptiveSpec()
    noise: NoiseSpec = NoiseSpec()
    order: Literal["interleaved", "shuffled", "sequential"] = "interleaved"
    seed: int = 0
    # fresh deployment per run; per arm per block; or all arms of a block up together
    restart: Literal["run", "arm", "block"] = "run"
    retries: int = Field(1, ge=0)  # extra launch attempts after a failed launch
    noise_band: float = Field(0.02, ge=0, lt=1, allow_inf_nan=False)
    primary_metric: str = "output_throughput_tok_s"
    timeouts: Timeouts = Timeouts()

    @field_validator("repetitions")
    @classmethod
    def _reps(cls, v: int | str, info: ValidationInfo) -> int | str:
        if is_stored(info):
            return v
        if isinstance(v, int) and v < 1:
            raise ValueError("Input should be greater than or equal to 1")
        if isinstance(v, int) and v > MAX_REPETITIONS:
            raise ValueError(
                f"Input should be less than or equal to {MAX_REPETITIONS} "
                '(or "auto" with [adaptive] min, max and budget_s)'
            )
        return v

    @field_validator("primary_metric")
    @classmethod
    def _primary(cls, v: str, info: ValidationInfo) -> str:
        if is_stored(info):
            return v
        valid = [k for k, m in METRICS.items() if m.higher_is_better is not None]
        if v not in valid:
            raise ValueError(f"unknown metric '{v}' (valid: {', '.join(valid)})")
        return v

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: str, info: ValidationInfo) -> str:
        if is_stored(info):  # an engine renamed or removed since: its results still report
            return v
        if v not in engines.REGISTRY:
            raise ValueError(f"unknown engine '{v}' (known: {', '.join(engines.names())})")
        return v

    @field_validator("arms")
    @classmethod
    def _arms(cls, v: dict[str, ArmSpec]) -> dict[str, ArmSpec]:
        if len(v) < 2:
            raise ValueError("an experiment needs at least two arms (a baseline and a change)")
        for name in v:
            if not re.match(_NAME, name):
                raise ValueError(f"arm name '{name}' must be letters, digits, '-', '_' or '.'")
        return v

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> ExperimentSpec:
        if is_stored(info):
            return self
        if self.baseline is not None and self.baseline not in self.arms:
            raise ValueError(
                f"baseline '{self.baseline}' is not an arm (arms: {', '.join(self.arms)})"
            )
        if self.engine == "external" and not self.url:
            raise ValueError("engine 'external' needs url = \"http://host:port\"")
        if self.engine == "command" and not self.command and not self.base.processes:
            raise ValueError('engine \'command\' needs command = ["prog", "--port", "{port}", ...]')
        if self.engine not in ("external", "command") and not self.model:
            raise ValueError(f"engine '{self.engine}' needs model = \"...\"")
        check_placement(self)
        if self.workload.sessions is not None and (self.load.sweep or self.load.replay):
            raise ValueError(
                "[workload.sessions] runs at concurrency (sessions in flight) or request_rate "
                "(session starts/s) load points: a capacity sweep's rates and a replay's clock "
                "are per request, not per session"
            )
        loads = [k for k, _, _ in self.load.keys()]
        unknown = [k for k in self.adaptive.primary or [] if k not in loads]
        if unknown:
            raise ValueError(
                f"adaptive.primary: {', '.join(unknown)} is not a load point of this experiment "
                f"(its load points: {', '.join(loads)})"
            )
        if self.repetitions == "auto" and self.order == "sequential":
            raise ValueError(
                'repetitions = "auto" decides on effects paired by block: use order = '
                '"interleaved" or "shuffled"'
            )
        return self

    @model_validator(mode="after")
    def _adaptive_needs_auto(self, info: ValidationInfo) -> ExperimentSpec:
        # an [adaptive] table under fixed repetitions was silently ignored: say so instead
        # (a table equal to the defaults changes nothing: a spec written back by to_json has one)
        if (not is_stored(info) and self.adaptive != AdaptiveSpec()
                and self.repetitions != "auto"):
            raise ValueError(
                f'[adaptive] is read only with repetitions = "auto" (this file says '
                f"repetitions = {self.repetitions}): set it to \"auto\" or remove [adaptive]"
            )
        return self

    @property
    def uses_ray(self) -> bool:
        """Whether any process of any arm may run on a Ray cluster."""
        return (
            self.placement == "ray"
            or any(p.placement == "ray" for p in self.base.processes or [])
            or any(a.placement == "ray" for a in self.arms.values())
        )

    @property
    def adaptive_on(self) -> bool:
        return self.repetitions == "auto"

    @property
    def blocks(self) -> int:
        """Blocks the plan holds: the fixed repetitions or the adaptive maximum, plus the extra
        blocks that may replace disturbed ones (noise.on_interference = 'repeat')."""
        base = self.adaptive.max if self.repetitions == "auto" else int(self.repetitions)
        extra = self.noise.max_repeats if self.noise.on_interference == "repeat" else 0
        return base + extra

    @property
    def baseline_arm(self) -> str:
        return self.baseline or next(iter(self.arms))

    @property
    def arm_order(self) -> list[str]:
        """The arms in file order with the baseline moved to the front (tables, schedule)."""
        base = self.baseline_arm
        return [base] + [a for a in self.arms if a != base]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def design_hash(self, since: int = 0) -> str:
        """Hash of what decides the measurements; repetitions and prose may change on a resume.
        `since`: the form of a later release (design/load.py ADDED_KEYS; 0: the canonical)."""
        d = self.to_json()
        # where the cluster listens may change between resumes; the nodes' asks may not
        for k in ("repetitions", "adaptive", "hypothesis", "timeouts", "retries", "noise_band",
                  "ray_address"):
            d.pop(k, None)
        for arm in d["arms"].values():
            arm.pop("description", None)
        drop_unset_placement(d)
        drop_added_defaults(d, since)
        # over the redacted form: a secret is no part of the design, and a hash of it would let
        # anyone holding the store test guesses of a short password offline
        return hashlib.sha256(orjson.dumps(redact(d), option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]

    def legacy_design_hashes(self) -> tuple[str, ...]:
        """The hashes releases after the first gave this design (a store of theirs resumes)."""
        return tuple(self.design_hash(i) for i in legacy_forms())
