"""An experiment's arms resolved into the processes they launch, and each planned command as the
deployment would render it, judged by the engine's own parser in the engine's interpreter (or
its generated flag table). The file format itself is design/model.py; the checks that refuse a
file before anything launches are preflight.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servelab import engines
from servelab.engines import flagcheck
from servelab.engines import recipe as recipes
from servelab.engines.base import FlagValue, ProcessConfig
from servelab.engines.launcher import Placement
from servelab.errors import UserError
from servelab.experiment.deploy.deployment import Deployment
from servelab.experiment.deploy.local import Site
from servelab.experiment.design.model import ExperimentSpec, ProcessSpec

if TYPE_CHECKING:
    from servelab.engines.flagcheck import Verdict


def layout_of(spec: ExperimentSpec) -> list[ProcessSpec]:
    if spec.base.processes:
        return list(spec.base.processes)
    return [ProcessSpec(role="server", command=spec.command)]


def resolve(spec: ExperimentSpec, arm_name: str) -> list[ProcessConfig]:
    """The process configurations of one arm, in launch order (router last)."""
    arm = spec.arms[arm_name]
    out: list[ProcessConfig] = []
    layout = sorted(layout_of(spec), key=lambda p: p.role == "router")
    for proc in layout:
        is_router = proc.role == "router"
        flags: dict[str, FlagValue] = {} if is_router else dict(spec.base.flags)
        env = dict(spec.base.env)
        flags.update(proc.flags)
        env.update(proc.env)
        applies = proc.role in arm.roles if arm.roles is not None else not is_router
        if applies:
            for rname in arm.recipes:
                r = recipes.get(rname)
                flags.update(r.flags_for(spec.engine))
                env.update(r.env)
            flags.update(arm.flags)
            for k in arm.remove:
                flags.pop(k, None)
            env.update(arm.env)
        flags = {k: v for k, v in flags.items() if v is not False}
        extra: dict[str, Any] = {"command": proc.command or spec.command}
        where = (arm.placement if applies else None) or proc.placement or spec.placement
        out.append(
            ProcessConfig(
                role=proc.role,
                flags=flags,
                env=env,
                host=spec.host,
                port=proc.port or 0,
                extra=extra,
                launcher=(proc.launcher or spec.base.launcher).launcher(),
                placement=placement_of(spec, proc, where),
            )
        )
    return out


def placement_of(spec: ExperimentSpec, proc: ProcessSpec, where: str) -> Placement:
    """A process's placement: local, or its asks of a Ray node."""
    if where != "ray":
        return Placement()
    return Placement(
        kind="ray",
        address=spec.ray_address,
        num_cpus=proc.num_cpus or 0.0,
        num_gpus=proc.num_gpus or 0.0,
        resources=tuple(sorted(proc.resources.items())),
        node_ip=proc.node_ip,
        node_labels=tuple(sorted(proc.node_labels.items())),
    )


def launcher_version(spec: ExperimentSpec, role: str) -> str | None:
    """The engine version a process's flag table is picked by (see LauncherSpec); the base's
    names the engine, so a router (its own package, e.g. sglang-router) takes only its own."""
    for p in layout_of(spec):
        if p.role == role and p.launcher is not None and p.launcher.version:
            return p.launcher.version
    return None if role == "router" else spec.base.launcher.version


@dataclass(frozen=True, slots=True)
class PlannedCommand:
    """One process of one arm as it would launch, and what the engine's parser said of it."""

    arm: str
    role: str
    argv: list[str]
    env: dict[str, str]
    verdict: Verdict | None


def planned(spec: ExperimentSpec, arm: str,
            addresses: list[str | None] | None = None) -> list[PlannedCommand]:
    """The command lines of an arm's processes as the deployment renders them (ports
    allocated, launcher applied), each judged by the engine's own parser where it can be
    imported in the engine's interpreter, else by the generated table (engines/flagcheck.py).
    `addresses`: per process, the Ray node's address it would bind (None: its own host)."""
    eng = engines.get(spec.engine)
    dep = Deployment(eng, spec.model, resolve(spec, arm), Path("."))
    hosts = addresses or [None] * len(dep.procs)
    sites = [Site(a or c.host) for a, c in zip(hosts, dep.procs, strict=True)]
    out = []
    for plan, cfg in zip(dep.plan(sites), dep.procs, strict=True):
        verdict = None
        if eng.parser is not None and spec.base.check_flags:
            args = plan.argv[len(cfg.launcher.argv(eng.entry(cfg.role))):]
            if eng.name == "vllm" and cfg.launcher.python:
                args = args[1:]                            # the module's "serve"
            try:
                verdict = flagcheck.judge(eng.parser, cfg.role, args, cfg.launcher,
                                          launcher_version(spec, cfg.role))
            except ValueError as exc:
                raise UserError(f"arms.{arm} ({cfg.role}): {exc}") from None
        out.append(PlannedCommand(arm, plan.role, plan.argv, plan.env, verdict))
    return out


def resolve_raw_base(spec: ExperimentSpec) -> list[ProcessConfig]:
    """The base processes without any arm delta (for checks of `remove`)."""
    return [
        ProcessConfig(
            role=p.role, flags={**({} if p.role == "router" else spec.base.flags), **p.flags}
        )
        for p in layout_of(spec)
    ]
