"""Experiment files comparing two arms of the scripted server on SLO capacity: one slot (a FIFO
queue, bench/scripted/script.py), `slow` one token per chunk, `fast` two, so `fast` sustains the
higher rate; launched by the `command` engine as real subprocesses on loopback."""

from __future__ import annotations

import sys

SWEEP = 'slo = "ttft_p90_ms=40", precision = 0.5, rates = 1, max_points = 5'


def scripted_capacity(name: str, settings: str, sweep: str = SWEEP) -> str:
    """The file's text; `settings` holds its own top-level keys (repetitions, restart, ...) and
    any tables that go before `[base.flags]` (e.g. `[adaptive]`); `sweep` the inline
    `[load] sweep` table's keys."""
    return f"""
name = "{name}"
engine = "command"
command = ["{sys.executable}", "-m", "servelab.bench.scripted", "--host", "{{host}}",
           "--port", "{{port}}", "--model", "{name}", "--no-log"]
baseline = "slow"
{settings.strip()}
[base.flags]
ttft-ms = 5
gap-ms = 4
max-running = 1
[arms.slow]
[arms.fast]
flags = {{ tokens-per-chunk = 2 }}
[load]
sweep = {{ {sweep} }}
[workload]
input_len = 8
output_len = 5
num_prompts = 8
[timeouts]
ready_s = 30
teardown_s = 5
"""
