"""Shared fixtures for experiment tests: a scripted-server experiment file and process scans."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest


def scripted_toml(
    name: str,
    *,
    marker: str | None = None,
    reps: int = 2,
    loads: str = "[1, 4]",
    prompts: int = 8,
    gap_ms: float = 4.0,
    extra: str = "",
    arms: str | None = None,
    restart: str = "arm",
) -> tuple[str, str]:
    """An experiment over the bench's scripted server: arm 'fast' streams 2 tokens per chunk.
    Returns (toml text, marker string found in every engine process's command line)."""
    marker = marker or f"marker-{uuid.uuid4().hex[:10]}"
    arms = (
        arms
        or """
[arms.slow]
[arms.fast]
flags = { tokens-per-chunk = 2 }
"""
    )
    text = f"""
name = "{name}"
hypothesis = "two tokens per chunk halve TPOT"
engine = "command"
command = ["{sys.executable}", "-m", "servelab.bench.scripted", "--host", "{{host}}",
           "--port", "{{port}}", "--model", "{marker}", "--no-log"]
baseline = "slow"
repetitions = {reps}
restart = "{restart}"
retries = 1
{extra}
[base.flags]
ttft-ms = 5
gap-ms = {gap_ms}
{arms}
[load]
concurrency = {loads}

[workload]
input_len = 8
output_len = 9
num_prompts = {prompts}

[timeouts]
ready_s = 30
teardown_s = 5
"""
    return text, marker


def procs_with(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains `marker`."""
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if marker.encode() in (d / "cmdline").read_bytes():
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    out.append(int(d.name))
        except OSError:
            continue
    return out


@pytest.fixture
def scripted():
    return scripted_toml


@pytest.fixture
def live_procs():
    return procs_with
