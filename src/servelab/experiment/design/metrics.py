"""The metrics an experiment measures and decides on: where each lives in a load point's summary,
its unit, and which direction is better. Part of the file's vocabulary (`primary_metric` is
checked against it), so the statistics and the report read the same table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Metric:
    key: str
    label: str
    unit: str
    higher_is_better: bool | None  # None: descriptive only (no verdict)
    path: tuple[str, ...]


ENERGY_METRIC = "j_per_output_token"  # shown beside the decided metric in the attribution table

METRICS: dict[str, Metric] = {
    m.key: m
    for m in (
        Metric(
            "output_throughput_tok_s",
            "output throughput",
            "tok/s",
            True,
            ("output_throughput_tok_s",),
        ),
        Metric(
            "request_throughput_req_s",
            "request throughput",
            "req/s",
            True,
            ("request_throughput_req_s",),
        ),
        Metric("ttft_ms", "TTFT median", "ms", False, ("ttft_ms", "median")),
        Metric("tpot_ms", "TPOT median", "ms", False, ("tpot_ms", "median")),
        Metric("e2e_ms", "E2E median", "ms", False, ("e2e_ms", "median")),
        Metric("accept_length", "acceptance length", "tokens/step", None, ("accept_length",)),
        # what explains a TTFT change: the prompt share the engine's prefix cache served, and
        # how far an open loop's sends fell behind their schedule (a trace replay's clock)
        Metric("cached_token_share", "cached prompt share", "fraction", None,
               ("cached_token_share",)),
        Metric("dispatch_lag_p99_ms", "dispatch lag p99", "ms", None, ("dispatch_lag_ms", "p99")),
        # energy over the load point from the GPUs' own counters (telemetry/energy.py): NaN
        # without a GPU (NVML n/a), so no spread, no effect and no verdict, never 0
        Metric("j_per_output_token", "energy per output token", "J/tok", False,
               ("j_per_output_token",)),
        Metric("output_tokens_per_j", "output tokens per joule", "tok/J", True,
               ("output_tokens_per_j",)),
    )
}


def metric_value(summary: dict[str, Any], metric: str) -> float:
    """The metric from a load-point summary; NaN when missing (never 0)."""
    return path_value(summary, METRICS[metric].path)


def path_value(summary: dict[str, Any], path: Sequence[str]) -> float:
    """The number at `path` (e.g. ("ttft_ms", "p99")) in a load-point summary; NaN when missing
    or not a number (never 0)."""
    node: Any = summary
    for part in path:
        if not isinstance(node, dict):
            return math.nan
        node = node.get(part)
    return float(node) if isinstance(node, int | float) and not isinstance(node, bool) else math.nan
