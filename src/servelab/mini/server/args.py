"""The one typed model of `servelab serve`'s flags, with their bounds.

Two callers read it: `servelab serve` (cli/serve.py) parses its command line through it, and the
embedded engine's pre-flight (engines/embedded.py `rules`, run by `servelab run FILE --check`
and before every run) judges an experiment's planned flags through it. So a value the server
would refuse (`num-threads = -4`, a port of 70000, `attention-backend = "flash"`) is refused
by `run --check` with the same one-line message, without starting a process. Flag names follow
SGLang's server arguments (dashes on the command line, underscores here). Light imports only:
the pre-flight must not pay for torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from servelab.errors import UserError
from servelab.mini.model.config import CONFIGS
from servelab.mini.server.pd.allow import parse_entry

# --speculative-algorithm spellings SGLang accepts for an MTP (NextN) head -> the one we run
SPEC_ALGORITHMS = {"EAGLE": "EAGLE", "NEXTN": "EAGLE", "MTP": "EAGLE"}
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's
DISAGGREGATION_MODES = ("null", "prefill", "decode")  # SGLang's --disaggregation-mode choices
DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's --disaggregation-bootstrap-port default
# SGLang reads the decode side's wait for a prefill's KV from SGLANG_DISAGGREGATION_WAITING_TIMEOUT
# (300 s by default); we take the same default, settable per server by a flag.
DEFAULT_WAITING_TIMEOUT_S = 300.0


def _int(v: Any) -> Any:
    """An integer as a command line or a TOML file writes it: 4 or "4", never true or 2.5."""
    if isinstance(v, bool):
        raise ValueError("must be an integer, not a boolean")
    if isinstance(v, str) and re.fullmatch(r"[+-]?\d+", v.strip()):
        return int(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if not isinstance(v, int):
        raise ValueError("must be an integer")
    return v


def _number(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError("must be a number, not a boolean")
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise ValueError("must be a number") from None
    return v


def _device(v: str) -> str:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", v):
        raise ValueError("use cpu, cuda or cuda:N")
    return v


def _hosts(v: str) -> str:
    """HOST[,HOST...]: host names, addresses, networks or `*` (pd/allow.py)."""
    return ",".join(parse_entry(e) for e in v.split(","))


def host_list(v: str | None) -> list[str]:
    """The entries of --disaggregation-allowed-bootstrap-hosts (none when unset)."""
    return v.split(",") if v else []


def _lower(v: Any) -> Any:
    return v.lower() if isinstance(v, str) else v


Int = Annotated[int, BeforeValidator(_int)]
Num = Annotated[float, BeforeValidator(_number)]
Port = Annotated[int, BeforeValidator(_int), Field(ge=1, le=65535)]


class ServeArgs(BaseModel):
    """Every flag of `servelab serve`, validated; `from_flags` gives the one-line error."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    config: str = "tiny"
    weights: str | None = None
    random_weights: bool = False
    host: str = Field("127.0.0.1", min_length=1, max_length=253)
    port: Port = 30000
    device: Annotated[str, AfterValidator(_device)] = "cpu"
    # KV slots; 65536 is far beyond what fits, and the engine checks the KV cache fits first
    max_running_requests: Int = Field(8, ge=1, le=65536)
    context_length: Int = Field(1024, ge=8, le=1 << 20)
    speculative_algorithm: str | None = None
    speculative_num_steps: Int = Field(1, ge=1, le=8)
    speculative_eagle_topk: Int = Field(1, ge=1, le=1)  # the engine drafts a chain
    speculative_num_draft_tokens: Int | None = Field(None, ge=2, le=9)
    cuda_graph: bool = False
    attention_backend: Literal["torch", "naive", "splitkv"] = "torch"
    seed: Int = Field(0, ge=0, le=2**63 - 1)
    num_threads: Int = Field(1, ge=1, le=1024)
    served_model_name: str | None = Field(None, min_length=1, max_length=256)
    log_level: Annotated[Literal[LOG_LEVELS], BeforeValidator(_lower)] = "warning"  # type: ignore[valid-type]
    disaggregation_mode: Literal[DISAGGREGATION_MODES] = "null"  # type: ignore[valid-type]
    # the prefix cache (SGLang's radix cache) is on unless this is set, as in SGLang
    disable_radix_cache: bool = False
    # tokens per prefix-cache block: prefixes are reused in whole pages (SGLang's --page-size;
    # its default is 1, ours 16 as vLLM's block size: the cache's bookkeeping is Python per block)
    page_size: Int = Field(16, ge=1, le=4096)
    disaggregation_bootstrap_port: Port = DEFAULT_BOOTSTRAP_PORT
    disaggregation_waiting_timeout: Num = Field(DEFAULT_WAITING_TIMEOUT_S, gt=0, le=86400)
    # decode: bootstrap hosts fetched from besides loopback and this machine's (pd/allow.py)
    disaggregation_allowed_bootstrap_hosts: Annotated[str, AfterValidator(_hosts)] | None = Field(
        None, min_length=1, max_length=8192)

    @model_validator(mode="after")
    def _consistent(self) -> ServeArgs:
        if self.config not in CONFIGS:
            raise ValueError(f"--config {self.config}: choose one of {', '.join(sorted(CONFIGS))}")
        algo = self.speculative_algorithm
        if algo is not None and algo.upper() not in SPEC_ALGORITHMS:
            raise ValueError(f"--speculative-algorithm {algo} is not supported; use one of "
                             f"{', '.join(sorted(SPEC_ALGORITHMS))}")
        if self.cuda_graph and not self.device.startswith("cuda"):
            raise ValueError("--cuda-graph needs --device cuda")
        # as the engine checks once loaded (engine.py); a --weights checkpoint may carry its own
        # positions, so only the config's own weights are judged here
        k = self.speculative_num_steps if algo else 0
        longest = CONFIGS[self.config].max_position - k - 2
        if self.weights is None and self.context_length > longest:
            raise ValueError(f"--context-length {self.context_length} is too long for config "
                             f"{self.config}: at most {longest}")
        if (self.disaggregation_mode == "prefill"
                and self.disaggregation_bootstrap_port == self.port):
            raise ValueError(f"--disaggregation-bootstrap-port {self.port} is also --port: a "
                             "prefill server needs two ports")
        return self

    @property
    def algorithm(self) -> str | None:
        """The speculative algorithm the engine runs (None: no speculation)."""
        a = self.speculative_algorithm
        return SPEC_ALGORITHMS[a.upper()] if a else None

    @classmethod
    def field_flags(cls) -> frozenset[str]:
        """Every flag name, dashed as on the command line."""
        return frozenset(k.replace("_", "-") for k in cls.model_fields)

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any]) -> ServeArgs:
        """Flags keyed by their dashed (or underscored) names -> ServeArgs, or a UserError of
        one line that names the flag, the value and the bound: "--num-threads -4: must be >= 1".
        A flag set to None is left at its default."""
        data = {k.replace("-", "_"): v for k, v in flags.items() if v is not None}
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise UserError(_one_line(exc)) from None


def _one_line(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    loc = [str(p) for p in err["loc"] if not str(p).startswith("function-")]
    msg = str(err["msg"]).removeprefix("Value error, ")
    ctx = err.get("ctx") or {}
    bounds = {"greater_than_equal": ">=", "less_than_equal": "<=", "greater_than": ">",
              "less_than": "<"}
    if err["type"] in bounds:
        key = {"greater_than_equal": "ge", "less_than_equal": "le", "greater_than": "gt",
               "less_than": "lt"}[err["type"]]
        msg = f"must be {bounds[err['type']]} {ctx.get(key)}"
    elif err["type"] == "extra_forbidden":
        msg = "is not a flag of servelab serve"
    if not loc:  # a model-level rule: its message names the flags
        return msg
    got = err.get("input")
    shown = repr(got) if isinstance(got, str) else str(got)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"--{loc[0].replace('_', '-')} {shown}: {msg[:1].lower() + msg[1:]}"
