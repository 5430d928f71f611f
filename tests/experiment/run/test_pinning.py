"""Core pinning (experiment/run/pinning.py): the plan gives the client and each engine disjoint
cores, or says why it does not pin."""

from __future__ import annotations

from servelab.experiment.run import pinning


def test_pinning_plan_is_disjoint_or_says_why_not():
    p = pinning.plan("auto", ["a", "b"], cores=[0, 1, 2, 3, 4, 5, 6])
    assert p.client == (0,) and p.engines == {"a": (1, 2, 3), "b": (4, 5, 6)}
    q = pinning.plan("auto", ["a", "b"], cores=[0, 1])
    assert not q.active and "need 3 cores, 2 usable" in q.note
    r = pinning.plan(True, ["a", "b"], cores=[0, 1])
    assert r.client == (0,) and r.engines == {"a": (1,), "b": (1,)} and "share" in r.note
    assert not pinning.plan(False, ["a"], cores=[0, 1, 2]).active
