"""The trade-off data behind the report's charts (experiment/report/tradeoff.py): the Pareto
front against a brute-force reading of its definition, and the SLO lines drawn."""

from __future__ import annotations

import itertools

import numpy as np

from servelab.experiment.report.tradeoff import Point, Tradeoff, slo_lines


def _pt(arm: str, gpu: float, user: float) -> Point:
    return Point(arm, f"k{gpu}-{user}", 1, None, None, user, gpu, {}, None)


def test_pareto_front_is_the_non_dominated_points():
    rng = np.random.default_rng(3)
    pts = [_pt("a", float(g), float(u)) for g, u in rng.integers(1, 40, size=(60, 2))]
    pts.append(_pt("b", 1000.0, 1000.0))  # another arm's point dominates all but is not a's
    tr = Tradeoff(arms=["a", "b"], points=pts)
    front = tr.front("a")
    a_pts = [p for p in pts if p.arm == "a"]

    def dominated(p: Point) -> bool:
        return any(q.tok_s_gpu >= p.tok_s_gpu and q.tok_s_user >= p.tok_s_user
                   and (q.tok_s_gpu, q.tok_s_user) != (p.tok_s_gpu, p.tok_s_user) for q in a_pts)

    want = {(p.tok_s_gpu, p.tok_s_user) for p in a_pts if not dominated(p)}
    assert {(p.tok_s_gpu, p.tok_s_user) for p in front} == want
    # along the front, more tok/s per GPU costs tok/s per user
    for p, q in itertools.pairwise(front):
        assert p.tok_s_gpu < q.tok_s_gpu and p.tok_s_user > q.tok_s_user
    assert tr.to_json()["front"]["b"] == [[1000.0, 1000.0]]


def test_slo_lines_come_from_the_sweep_and_goodput():
    slo = "ttft_p99_ms=2000,tpot_p95_ms=50,tpot_ms=40"  # [load.sweep] slo
    lines = slo_lines(slo, {"e2e_ms": 9000.0, "ttft_ms": 2000.0})
    # the goodput limit equal to a drawn SLO is not drawn twice
    assert lines["ttft_ms"] == [("SLO ttft_p99_ms <= 2000", 2000.0)]
    assert [ms for _, ms in lines["tpot_ms"]] == [50.0, 40.0]
    assert lines["e2e_ms"] == [("goodput e2e_ms <= 9000", 9000.0)]
    assert slo_lines(None) == {}
