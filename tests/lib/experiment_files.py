"""A small experiment file and its one-line errors, shared by the tests of parsing
(tests/experiment/design/test_parse.py) and pre-flight (tests/experiment/plan/test_preflight.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.errors import UserError
from servelab.experiment.design.model import ExperimentSpec
from servelab.experiment.plan.preflight import load

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

BASE = """
name = "x"
engine = "{engine}"
model = "{model}"
[arms.a]
[arms.b]
{arm_b}
[load]
concurrency = [1, 8]
"""


def load_text(tmp_path: Path, text: str) -> ExperimentSpec:
    """The experiment file `text`, loaded as the CLI loads a file (validated, pre-flighted)."""
    f = tmp_path / "e.toml"
    f.write_text(text)
    return load(f)


def error_of(tmp_path: Path, text: str) -> str:
    """The one-line error of loading `text` (it must fail, and in one line)."""
    with pytest.raises(UserError) as ei:
        load_text(tmp_path, text)
    msg = str(ei.value)
    assert "\n" not in msg
    return msg
