"""The experiment's `--json` document (kind `experiment`, docs/JSON.md): what the report
shows, as data, read from Evidence like every other view."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servelab.experiment.report import sections
from servelab.experiment.stats import capacity
from servelab.experiment.stats.analysis import headline
from servelab.experiment.stats.evidence import Evidence


def experiment_document(data: Evidence, report: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`servelab run` / `servelab report` / `servelab demo --json`: the statistics behind the
    attribution table, the SLO capacity effects, the warnings and (report) the files written."""
    an = data.analysis
    per, cap_effects, suggested = sections.sections(data)
    doc: dict[str, Any] = {
        "name": data.name, "baseline": an.baseline, "arms": an.arms, "load_keys": an.load_keys,
        "noise_band": an.noise_band, "primary_metric": data.primary,
        "runs": {"stored": len(data.runs), "ok": sum(r.status == "ok" for r in data.runs)},
        "spreads": [
            {"arm": s.arm, "load_key": s.load_key, "metric": s.metric, "n": s.n,
             "median": s.median, "min": s.min, "max": s.max, "cv": s.cv,
             "ci_low": s.ci_low, "ci_high": s.ci_high, "values": list(s.values)}
            for s in an.spreads.values()],
        "effects": [
            {"arm": e.arm, "baseline": e.baseline, "load_key": e.load_key, "metric": e.metric,
             "ratio": e.ratio, "ci_low": e.ci_low, "ci_high": e.ci_high, "n": e.n,
             "paired": e.paired, "verdict": e.verdict, "rule": e.rule,
             "decided_at": e.decided_at,
             # the GPU throttling (arm's or baseline's runs) that could have moved the verdict
             "gpu_throttled": an.throttle_note(e.arm, e.load_key),
             # runs of either side above saturation (queue grew throughout the load)
             "above_saturation": an.saturation_note(e.arm, e.load_key)}
            for e in an.effects.values()],
        "throttling": [t.to_json() for t in an.throttle.values()],
        "capacity": {
            "arms": [{"arm": a.arm, "text": a.text(), "paired_sweeps": a.paired,
                      "brackets": [{"status": b.status, "low_req_s": b.low, "high_req_s": b.high}
                                   for b in a.brackets]} for a in per],
            "effects": [capacity.to_json(e) for e in cap_effects]},
        "headline": headline(an, data.primary),
        "suggested": suggested,
        "warnings": list(an.warnings),
    }
    if report:
        doc["report"] = dict(report)
    return doc
