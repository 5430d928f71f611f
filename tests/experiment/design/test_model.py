"""Settings that change verdicts are validated before anything runs (one line, exit 2, no row
stored) (experiment/design/model.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.errors import UserError
from servelab.experiment.plan.preflight import load
from servelab.store import Store

BASE = """name = "{name}"
engine = "embedded"
model = "tiny"
{extra}
[arms.a]
[arms.b]
recipe = "mtp-conservative"
[load]
concurrency = [1]
"""


def _servelab(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "SERVELAB_HOME": str(tmp_path / "home"), "COLUMNS": "300"}
    return subprocess.run(
        [sys.executable, "-m", "servelab", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# the three findings of the hardening report run end to end through the CLI; the other bounds
# through the same parser in-process (a subprocess each would add ~4 s of imports apiece)
CLI_CASES = [
    (
        'primary_metric = "speed"',
        "primary_metric: unknown metric 'speed' (valid: output_throughput_tok_s, "
        "request_throughput_req_s, ttft_ms, tpot_ms, e2e_ms, j_per_output_token, "
        "output_tokens_per_j)",
    ),
    ("repetitions = 99999999999999", "repetitions: Input should be less than or equal to 1000"),
    ('repetitions = "3"', 'repetitions: must be a whole number from 1 to 1000, or "auto"'),
]
PARSE_CASES = [
    ("repetitions = true", 'repetitions: must be a whole number from 1 to 1000, or "auto"'),
    ("noise_band = nan", "noise_band: Input should be a finite number"),
    ("noise_band = inf", "noise_band: Input should be a finite number"),
    ("noise_band = -0.1", "noise_band: Input should be greater than or equal to 0"),
    ("noise_band = 1.0", "noise_band: Input should be less than 1"),
    ('repetitions = "auto"\n[adaptive]\nmin = 8\nmax = 4', "adaptive: min (8) must be <= max (4)"),
    ('repetitions = "auto"\n[adaptive]\nbudget_s = nan', "adaptive.budget_s: Input should be"),
    ('repetitions = "auto"\n[adaptive]\nmax = 101', "adaptive.max: Input should be less than"),
    (
        'repetitions = "auto"\n[adaptive]\nprimary = ["c=16"]',
        "adaptive.primary: c=16 is not a load point of this experiment (its load points: c=1)",
    ),
    ('repetitions = "auto"\n[adaptive]\nprimary = []', "primary must name at least one"),
    ('repetitions = "auto"\n[adaptive]\nboundary = "haybittle"', "adaptive.boundary: "),
    ('[noise]\npin = "yes"', 'noise.pin: must be true, false or "auto"'),
    ("[noise]\nmax_steal = 2", "noise.max_steal: Input should be less than or equal to 1"),
    ('repetitions = "auto"\norder = "sequential"', 'use order = "interleaved" or "shuffled"'),
]


@pytest.mark.parametrize(("extra", "want"), CLI_CASES)
def test_check_refuses_settings_that_change_verdicts(tmp_path, extra, want):
    f = tmp_path / "e.toml"
    f.write_text(BASE.format(name="e", extra=extra))
    p = _servelab(tmp_path, "run", str(f), "--check", timeout=30)  # bounded: never a hang
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert want in err, err


@pytest.mark.parametrize(("extra", "want"), PARSE_CASES)
def test_bounds_of_the_statistics_settings(tmp_path, extra, want):
    f = tmp_path / "e.toml"
    f.write_text(BASE.format(name="e", extra=extra))
    with pytest.raises(UserError) as exc:
        load(f)
    assert want in str(exc.value) and "\n" not in str(exc.value)


def test_a_300_character_name_is_refused_before_any_row_is_stored(tmp_path):
    f = tmp_path / "long.toml"
    f.write_text(BASE.format(name="x" * 300, extra=""))
    p = _servelab(tmp_path, "run", str(f), "--store", str(tmp_path / "r.db"))
    assert p.returncode == 2 and "name: String should have at most 100 characters" in p.stderr
    with Store(tmp_path / "r.db") as st:
        assert st.experiment_names() == []


def test_check_prints_the_stopping_rule_of_adaptive_repetitions(tmp_path):
    f = tmp_path / "auto.toml"
    f.write_text(
        BASE.format(name="auto", extra='repetitions = "auto"\n[adaptive]\nmin = 4\nmax = 6')
    )
    p = _servelab(tmp_path, "run", str(f), "--check")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count(" block ") == 12  # the most it may run: 6 blocks x 2 arms
    assert 'repetitions = "auto": blocks 4 to 6' in p.stdout
    assert "repeated-t confidence sequence" in p.stdout and "noise control: pin = auto" in p.stdout


def test_the_spec_accepts_exactly_the_boundaries_the_rule_knows():
    """`[adaptive] boundary` is validated by the spec's Literal and computed by sequential.py:
    one list must not grow without the other."""
    import typing

    from servelab.experiment.design.model import AdaptiveSpec
    from servelab.experiment.stats import sequential

    accepted = typing.get_args(AdaptiveSpec.model_fields["boundary"].annotation)
    assert set(accepted) == set(sequential.BOUNDARIES)
    for b in accepted:  # and each has a calibrated design
        assert sequential.boundary_constant(4, 12, 0.05, b) > 0
