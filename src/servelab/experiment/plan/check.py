"""`servelab run FILE --check`: what would launch, judged, without launching anything.

Per arm and process: the exact command line (launcher prefix, ports allocated as the
deployment allocates them: a real run allocates fresh ones), the environment it adds to the
runner's, and the verdict of the engine's own parser (or of the generated table, named) that
pre-flight already required to pass; for a process placed on Ray, the node it would land on
with the cluster's resources now (experiment/plan/placement.py; a plan the cluster cannot place is
refused). `as_json` is the same for tools.
"""

from __future__ import annotations

import shlex
from typing import Any

from servelab.experiment.design.model import ExperimentSpec
from servelab.experiment.plan import placement, processes
from servelab.experiment.plan.schedule import plan
from servelab.redaction import redact


def collect(spec: ExperimentSpec, source: str | None = None) -> dict[str, Any]:
    """The plan as data: arms -> processes (role, argv, env, verdict, node), and the run
    schedule. `node` is None for a process on this host, else the Ray node it would land on
    ({node_id, ip, candidates}: how many nodes could take it); UserError when the cluster
    cannot place a process. Secret values (flags, env, URLs) are redacted."""
    nodes: dict[str, list[dict | None]] = {}
    if spec.uses_ray:
        nodes = placement.predict(spec, source)
    arms = {}
    for arm in spec.arms:
        where = nodes.get(arm) or [None] * len(processes.resolve(spec, arm))
        arms[arm] = [
            {"role": c.role, "argv": c.argv, "env": c.env, "node": n,
             "verdict": None if c.verdict is None else {
                 "ok": c.verdict.ok, "error": c.verdict.error, "by": c.verdict.by,
                 "version": c.verdict.version}}
            for c, n in zip(processes.planned(spec, arm, [n and n["ip"] for n in where]),
                            where, strict=True)
        ]
    # redacted here, so the text lines and the --json document both show no secret
    return redact({"name": spec.name, "engine": spec.engine, "model": spec.model, "arms": arms,
                   "ports_note": "ports are allocated again at launch; these show the layout",
                   "schedule": [{"seq": p.seq, "block": p.block, "deploy": p.group,
                                 "run": p.describe()} for p in plan(spec)]})


def lines(data: dict[str, Any]) -> list[str]:
    """The plan as text, one command per process (shell-quoted, copy-pasteable)."""
    out = [f"experiment {data['name']}: engine {data['engine']}, model {data['model'] or '-'}"]
    for arm, procs in data["arms"].items():
        out.append(f"arm {arm}:")
        for p in procs:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in p["env"].items())
            out.append(f"  [{p['role']}] {env + ' ' if env else ''}{shlex.join(p['argv'])}")
            n = p.get("node")
            if n is not None:
                others = f" (one of {n['candidates']} that fit)" if n["candidates"] > 1 else ""
                out.append(f"      on Ray node {n['ip']} ({n['node_id'][:8]}){others}")
            v = p["verdict"]
            if v is not None:
                out.append(f"      {'accepted' if v['ok'] else 'REJECTED: ' + str(v['error'])}"
                           f" by {v['by']}")
    out.append(f"({data['ports_note']})")
    out.append("schedule:")
    out += [f"{s['seq']:3d} block {s['block']} deploy {s['deploy']:3d}  {s['run']}"
            for s in data["schedule"]]
    return out
