"""Every check of an experiment that can fail without launching anything, and `load`: an
experiment file read, validated (design/parse.py) and pre-flighted, as the CLI and the demo take
it. The engine's own parser (or its generated flag table) judges every planned command
(processes.py `planned`); Ray placement needs Ray installed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from servelab import engines
from servelab.engines import recipe as recipes
from servelab.engines.base import ProcessConfig
from servelab.errors import UserError
from servelab.experiment.deploy.ray_nodes import require_ray
from servelab.experiment.design.model import ExperimentSpec
from servelab.experiment.design.parse import read
from servelab.experiment.plan.processes import layout_of, planned, resolve, resolve_raw_base


def load(path: str | Path, transform: Callable[[dict], dict] | None = None) -> ExperimentSpec:
    """Read, validate and pre-flight an experiment file; raises UserError with one line.
    `transform` rewrites the parsed TOML before validation (the demo's quick variant)."""
    spec = read(path, transform)
    preflight(spec, str(Path(path)))
    return spec


def preflight(spec: ExperimentSpec, source: str = "<experiment>") -> None:
    """Every check that can fail without launching anything; raises UserError (one line)."""
    try:  # the bench's own checks (dataset and tokenizer files exist, goodput keys, ...)
        spec.workload.bench_config(spec.url or "http://127.0.0.1:1")
    except UserError as exc:
        raise UserError(f"{source}: workload: {exc}") from None
    if spec.uses_ray:
        require_ray(source)
    eng = engines.get(spec.engine)
    layout = layout_of(spec)
    roles = [p.role for p in layout]
    for r in roles:
        if r not in eng.roles:
            raise UserError(
                f"{source}: base.processes: engine '{spec.engine}' cannot run a '{r}' "
                f"process (roles: {', '.join(eng.roles)})"
            )
    if len(layout) > 1 and roles.count("router") != 1:
        raise UserError(
            f"{source}: base.processes: a deployment of several processes needs "
            "exactly one 'router' process (the endpoint the benchmark talks to)"
        )
    if not eng.launches:
        for name, arm in spec.arms.items():
            if arm.flags or arm.remove or arm.recipe or arm.env:
                raise UserError(
                    f"{source}: arms.{name}: engine 'external' is not launched by "
                    "servelab, so arms cannot change flags or env"
                )
    base_flags = [p.flags for p in resolve_raw_base(spec)]
    for name, arm in spec.arms.items():
        missing = [r for r in arm.roles or [] if r not in roles]
        if missing:  # the delta would silently apply to nothing: the arm would equal the base
            raise UserError(
                f"{source}: arms.{name}.roles: no '{missing[0]}' process in this deployment "
                f"(its processes: {', '.join(roles)})"
            )
        for rname in arm.recipes:
            try:
                recipes.get(rname).flags_for(spec.engine)
            except UserError as exc:
                raise UserError(f"{source}: arms.{name}.recipe: {exc}") from None
        for k in arm.remove:
            if all(k not in flags for flags in base_flags):
                raise UserError(f"{source}: arms.{name}.remove: flag '{k}' is not set in the base")
        for proc in resolve(spec, name):
            problems = (
                eng.check(spec.model, proc.role, proc.flags)
                if spec.base.check_flags
                else eng.rules(spec.model, proc.role, proc.flags)
            )
            if proc.role != "router":
                problems += recipes.constraint_problems(spec.model, proc.flags)
            if problems:
                more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
                raise UserError(f"{source}: arms.{name} ({proc.role}): {problems[0]}{more}")
        _check_ports_and_roles(resolve(spec, name), f"{source}: arms.{name}")
        if spec.base.check_flags and eng.parser is not None:
            for cmd in planned(spec, name):
                v = cmd.verdict
                if v is not None and not v.ok:
                    raise UserError(
                        f"{source}: arms.{name} ({cmd.role}): {v.error} [judged by {v.by}]; "
                        "fix the flag, or set base.check_flags = false"
                    )


# the flags of one speculative setup: SGLang's PD requires them on prefill and decode alike (the
# prefill drafts the first step's tokens and sends the draft layer's KV); with them on one role
# only the run fails after launch with a 502
_SPEC_PREFIX = "speculative-"


def _check_ports_and_roles(procs: list[ProcessConfig], where: str) -> None:
    """What a deployment's processes would collide on or disagree about, caught before launch
    (else the run fails only after its launch timeouts): two processes given the same port, a
    bootstrap port equal to a process's HTTP port, speculative decoding on one PD role only."""
    taken: dict[int, str] = {}
    for i, p in enumerate(procs):
        ports = [(p.port, "port")] if p.port else []
        boot = p.flags.get("disaggregation-bootstrap-port")
        if isinstance(boot, int) and not isinstance(boot, bool):
            ports.append((boot, "disaggregation-bootstrap-port"))
        for port, what in ports:
            here = f"process {i + 1} ({p.role}) {what}"
            if port in taken:
                raise UserError(f"{where}: {here} {port} is also {taken[port]}; give each "
                                "process its own ports (or leave them out to have them allocated)")
            taken[port] = here
    spec_flags = {p.role: {k: v for k, v in p.flags.items() if k.startswith(_SPEC_PREFIX)}
                  for p in procs if p.role in ("prefill", "decode")}
    if len(spec_flags) == 2 and spec_flags["prefill"] != spec_flags["decode"]:
        only = "decode" if spec_flags["decode"] and not spec_flags["prefill"] else (
            "prefill" if spec_flags["prefill"] and not spec_flags["decode"] else None)
        what = f"on the {only} process only" if only else "differ between prefill and decode"
        raise UserError(f"{where}: speculative flags {what}: a PD deployment needs the same "
                        "--speculative-* flags on both (apply the arm to roles = [\"prefill\", "
                        "\"decode\"])")
