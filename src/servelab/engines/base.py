"""The engine adapter interface: how to start one serving engine and how to observe it.

An adapter renders the command line of each process of a deployment (a server; or prefill,
decode and router for disaggregated serving), knows its readiness probe, where it reports its
own configuration, and how to read its Prometheus metrics. It holds no benchmarking logic.
Adding an engine is one file: subclass `Engine`, then add it to `servelab.engines.REGISTRY`.
"""

from __future__ import annotations

import difflib
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from servelab.engines.launcher import Entry, Launcher, Placement

FlagValue = str | int | float | bool | list[str | int | float]
Flags = dict[str, FlagValue]


@dataclass(frozen=True, slots=True)
class ProcessPlan:
    """One process of a deployment, before it is launched."""

    role: str  # 'server', 'prefill', 'decode' or 'router'
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    health_url: str
    url: str  # base URL of this process (http://host:port)


@dataclass(frozen=True, slots=True)
class ProcessConfig:
    """The resolved configuration of one process, input to `Engine.command`."""

    role: str
    flags: Flags
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # engine-specific, e.g. bootstrap_port
    launcher: Launcher = field(default_factory=Launcher)  # where the engine lives
    placement: Placement = field(default_factory=Placement)  # where the process runs


def pd_workers(proc: ProcessConfig, peers: Mapping[str, ProcessPlan]) -> list[str]:
    """A PD router's workers as sglang_router takes them: `--prefill URL [BOOTSTRAP_PORT]` per
    prefill server (its bootstrap port as allocated for it) and `--decode URL` per decode server."""
    argv: list[str] = []
    for plan in peers.values():
        if plan.role == "prefill":
            argv += ["--prefill", plan.url]
            boot = proc.extra.get(f"bootstrap_port:{plan.port}")
            if boot:
                argv.append(str(boot))
        elif plan.role == "decode":
            argv += ["--decode", plan.url]
    return argv


def render_flags(flags: Mapping[str, FlagValue]) -> list[str]:
    """`{"tp-size": 8, "trust-remote-code": True, "cuda-graph-bs": [1, 2]}` ->
    `--tp-size 8 --trust-remote-code --cuda-graph-bs 1 2`. False drops the flag."""
    out: list[str] = []
    for key, val in flags.items():
        if val is False or val is None:
            continue
        out.append(f"--{key}")
        if val is True:
            continue
        if isinstance(val, list):
            out.extend(str(v) for v in val)
        else:
            out.append(str(val))
    return out


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes] | None:
    """GET `url`; (status, body), or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (user URL)
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except (OSError, ValueError):
        return None


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {'name{label="v"}': value}; unlabelled samples by name only."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = float(s.value)
    return out


class Engine:
    """Base adapter. Subclasses set the class attributes and override `args` (and `entry`)."""

    name: ClassVar[str] = "base"
    launches: ClassVar[bool] = True  # False: an existing URL (external)
    roles: ClassVar[tuple[str, ...]] = ("server",)  # process roles this engine can run
    # servelab's own flags for engines servelab itself implements (embedded); None: the
    # engine's own parser judges (parser = its name in engines/parser_probe.py)
    known_flags: ClassVar[frozenset[str] | None] = None
    parser: ClassVar[str | None] = None
    health_path: ClassVar[str] = "/health"
    info_path: ClassVar[str | None] = None
    metrics_path: ClassVar[str | None] = "/metrics"
    # (flag a, flag b) pairs that must not be set together
    conflicts: ClassVar[tuple[tuple[str, str], ...]] = ()

    def entry(self, role: str) -> Entry:
        """The program of a process of `role` (a Python module or a console command)."""
        raise NotImplementedError

    def args(self, proc: ProcessConfig, model: str, peers: Mapping[str, ProcessPlan]) -> list[str]:
        """The engine's own arguments of one process (what its parser reads)."""
        raise NotImplementedError

    def command(
        self, proc: ProcessConfig, model: str, peers: Mapping[str, ProcessPlan]
    ) -> list[str]:
        """The argv of one process: the launcher's program part, then the engine's arguments;
        `peers` are the processes already planned (for a router)."""
        return proc.launcher.argv(self.entry(proc.role)) + self.args(proc, model, peers)

    def port_flags(self, role: str) -> tuple[str, ...]:
        """Flags naming a port the process binds besides its HTTP port; the deployment gives
        each process its own free one unless the file sets it, so several processes (PD,
        several arms) fit one node."""
        return ()

    def check(self, model: str, role: str, flags: Mapping[str, FlagValue]) -> list[str]:
        """Pre-flight problems of one process's flags that need no parser (empty when fine):
        servelab's own flags (embedded engine), conflicting pairs, the engine's rules."""
        problems: list[str] = []
        known = self.flags_for(role)
        if known is not None:
            for key in flags:
                if key not in known:
                    near = difflib.get_close_matches(key, sorted(known), n=1)
                    hint = f" (did you mean '{near[0]}'?)" if near else ""
                    problems.append(f"unknown {self.name} flag '{key}'{hint}")
        set_flags = {k for k, v in flags.items() if v is not False and v is not None}
        for a, b in self.conflicts:
            if a in set_flags and b in set_flags:
                problems.append(f"flags '{a}' and '{b}' conflict; set only one")
        problems.extend(self.rules(model, role, flags))
        return problems

    def flags_for(self, role: str) -> frozenset[str] | None:
        """servelab's own flag names for a role (None: the engine's parser judges)."""
        return self.known_flags

    def rules(self, model: str, role: str, flags: Mapping[str, FlagValue]) -> list[str]:
        """Engine-specific consistency rules; override."""
        return []

    # ---- observing a running process ---------------------------------------------------------

    def ready(self, url: str) -> bool:
        """True once the process answers its health probe with 200."""
        got = http_get(url.rstrip("/") + self.health_path)
        return got is not None and got[0] == 200

    def _fetch(self, url: str, path: str | None) -> bytes | None:
        """The body of GET `path` on the process, or None when the engine serves no such path
        (None) or the answer is not a 200 within 5 s."""
        if not path:
            return None
        got = http_get(url.rstrip("/") + path, timeout_s=5.0)
        return got[1] if got and got[0] == 200 else None

    def info(self, url: str) -> dict[str, Any] | None:
        """The server's own description of its configuration, when it has one."""
        return self._json(url, self.info_path)

    def _json(self, url: str, path: str | None) -> dict[str, Any] | None:
        """GET `path` as a JSON object (a non-object is wrapped as {"value": ...}); None when
        absent or not JSON."""
        body = self._fetch(url, path)
        if body is None:
            return None
        try:
            data = json.loads(body)
        except ValueError:
            return None
        return data if isinstance(data, dict) else {"value": data}

    def acceptance(
        self, before: Mapping[str, float] | None, after: Mapping[str, float] | None
    ) -> dict[str, float | str | None]:
        """Speculative acceptance over a measurement window from two scrapes (vLLM-named
        counters by default); `source` says where it came from."""
        return spec_window(before, after)

    def scrape(self, url: str) -> dict[str, float] | None:
        """Prometheus samples of the process, or None when it serves no metrics."""
        body = self._fetch(url, self.metrics_path)
        if body is None:
            return None
        try:
            return parse_prometheus(body.decode(errors="replace"))
        except ValueError:
            return None


def spec_window(
    before: Mapping[str, float] | None, after: Mapping[str, float] | None
) -> dict[str, float | str | None]:
    """Acceptance over a window from vLLM-named counters (also served by the embedded engine):
    tau = 1 + d(accepted)/d(drafts), rate = d(accepted)/d(draft_tokens), each counter summed
    over its label sets (vllm/v1/spec_decode/metrics.py labels them by model and engine).
    None when absent."""
    out: dict[str, float | str | None] = {
        "accept_length": None,
        "accept_rate": None,
        "source": None,
    }
    if not before or not after:
        return out

    def total(samples: Mapping[str, float], name: str) -> float | None:
        # vLLM labels its counters (model_name, engine): sum every label set of the series
        names = (name + "_total", name)
        vals = [v for k, v in samples.items() if k.split("{", 1)[0] in names]
        return sum(vals) if vals else None

    def delta(name: str) -> float | None:
        now = total(after, name)
        return None if now is None else now - (total(before, name) or 0.0)

    drafts = delta("vllm:spec_decode_num_drafts")
    draft_tokens = delta("vllm:spec_decode_num_draft_tokens")
    accepted = delta("vllm:spec_decode_num_accepted_tokens")
    if drafts and accepted is not None and drafts > 0:
        out["accept_length"] = 1.0 + accepted / drafts
        out["source"] = "metrics-window"
    if draft_tokens and accepted is not None and draft_tokens > 0:
        out["accept_rate"] = accepted / draft_tokens
    return out
