"""Tuning for the engine that will read the files: a tuned config replaces the shipped one only
when clearly faster."""

from __future__ import annotations

from servelab.tune import engine_tune
from servelab.tune.space import Config


def test_shipped_config_is_kept_unless_clearly_beaten():
    shipped, other = Config(64, 64, 128, 1, 4, 5), Config(16, 64, 128, 1, 4, 4, 4, True)
    assert engine_tune.choose({shipped: 10.0, other: 9.95}, shipped, 0.015) == shipped
    assert engine_tune.choose({shipped: 10.0, other: 9.0}, shipped, 0.015) == other
    assert engine_tune.choose({other: 9.0}, shipped, 0.015) == other       # shipped failed
    assert engine_tune.choose({}, shipped, 0.015) == shipped
