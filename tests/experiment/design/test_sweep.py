"""`[load.sweep]` of an experiment file (experiment/design/sweep.py): validated in one line."""

from __future__ import annotations

import pytest

from servelab.errors import UserError
from servelab.experiment.design.parse import parse


def _spec(load: str) -> dict:
    import tomllib

    return tomllib.loads(f"""
name = "x"
engine = "external"
url = "http://127.0.0.1:1"
[arms.a]
[arms.b]
[load]
{load}
""")


def test_sweep_spec_is_validated_in_one_line():
    s = parse(_spec('sweep = { slo = "ttft_p99_ms=2000", precision = 0.05 }'))
    assert s.load.keys() == [("capacity", None, None)] and s.load.sweep.precision == 0.05
    with pytest.raises(UserError, match=r"^<experiment>: load\.sweep\.slo: .*not an SLO"):
        parse(_spec('sweep = { slo = "latency=5" }'))
    with pytest.raises(UserError, match=r"load\.sweep: .*max_points 4 leaves no room"):
        parse(_spec('sweep = { slo = "ttft:500", rates = 3, max_points = 4 }'))
    with pytest.raises(UserError, match="sweep = "):
        parse(_spec("burstiness = 1.0"))
