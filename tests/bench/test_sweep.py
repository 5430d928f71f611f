"""The capacity search on model servers given as functions (latency as a closed-form function of
the rate), so the true capacity is known exactly: the bracket must contain it, be as narrow as
asked, and take the number of load points bisection predicts."""

from __future__ import annotations

import math

import pytest

from servelab.bench.config import LoadPoint
from servelab.bench.slo import parse_slo
from servelab.bench.sweep import SweepConfig, first_crossing, sweep
from servelab.errors import UserError

R_SYNC, R_SAT = 4.0, 20.0


def lat(p99: float | None) -> dict:
    return {"mean": p99, "median": p99, "p90": p99, "p95": p99, "p99": p99, "std": 0.0}


def model(ttft_of_rate, r_sync=R_SYNC, r_sat=R_SAT, sync_ttft=50.0, failed_of_rate=None):
    """A fake server: TTFT p99 as a function of the offered rate; the rates it completes."""
    calls: list[LoadPoint] = []

    def measure(load: LoadPoint) -> dict:
        calls.append(load)
        if load.concurrency is not None:
            ttft, achieved = sync_ttft, r_sync
        elif math.isinf(load.request_rate):
            ttft, achieved = 10_000.0, r_sat
        else:
            ttft, achieved = ttft_of_rate(load.request_rate), min(load.request_rate, r_sat)
        failed = failed_of_rate(load.request_rate) if failed_of_rate and load.request_rate else 0
        return {"ttft_ms": lat(ttft), "tpot_ms": lat(10.0), "completed": 100 - failed,
                "failed": failed, "issued": 100, "request_throughput_req_s": achieved,
                "failure_reasons": {}}

    return measure, calls


def queue_like(r: float) -> float:
    """Flat, then rising ever faster towards saturation (an M/D/1-like p99 TTFT), in ms."""
    return 50.0 + 40.0 * r / (R_SAT * 1.05 - r)


def true_capacity(limit: float) -> float:
    # solve 50 + 40 r / (21 - r) = limit
    a = limit - 50.0
    return a * R_SAT * 1.05 / (40.0 + a)


@pytest.mark.parametrize("limit,precision", [(150.0, 0.05), (300.0, 0.02), (90.0, 0.1),
                                             (120.0, 0.01)])
def test_bracket_contains_the_true_capacity_within_precision(limit, precision):
    measure, calls = model(queue_like)
    cfg = SweepConfig(slo=parse_slo(f"ttft_p99_ms={limit}"), precision=precision, grid_rates=3,
                      max_points=30)
    res = sweep(measure, cfg)
    cap = res.capacity
    truth = true_capacity(limit)
    assert cap.status == "bracketed", cap
    assert cap.low_req_s <= truth <= cap.high_req_s
    assert cap.width <= precision
    assert res.synchronous_req_s == R_SYNC and res.saturated_req_s == R_SAT
    # the order: synchronous, throughput, the grid strictly between them, then refinements
    assert calls[0] == LoadPoint(concurrency=1) and math.isinf(calls[1].request_rate)
    assert [c.request_rate for c in calls[2:5]] == [8.0, 12.0, 16.0]
    assert [p.role for p in res.points[:5]] == ["synchronous", "throughput", "grid", "grid", "grid"]
    # bisection from the grid step (or from the saturated rate when every grid rate met)
    lo0 = max([r for r in (8.0, 12.0, 16.0) if queue_like(r) <= limit], default=None)
    hi0 = min([r for r in (8.0, 12.0, 16.0, R_SAT) if queue_like(r) > limit])
    refinements = len(calls) - 5 - (1 if lo0 == 16.0 else 0)
    assert refinements <= math.ceil(math.log2((hi0 - lo0) / (precision * truth))) + 1


def test_every_point_is_checked_and_kept_in_order():
    seen = []
    measure, calls = model(queue_like)
    res = sweep(measure, SweepConfig(slo=parse_slo("ttft_p99_ms=150"), precision=0.05),
                on_point=seen.append)
    assert [p.load for p in seen] == calls == [p.load for p in res.points]
    for p in res.points:
        assert p.check is not None and p.check.met == (p.summary["ttft_ms"]["p99"] <= 150)
    assert len(calls) <= 12


def test_rates_are_rounded_to_readable_keys():
    measure, calls = model(queue_like, r_sync=3.3333333, r_sat=19.999)
    sweep(measure, SweepConfig(slo=parse_slo("ttft_p99_ms=150"), precision=0.05))
    for c in calls[2:]:
        assert c.request_rate == float(f"{c.request_rate:.4g}")


def test_unmet_at_synchronous_stops_early():
    measure, calls = model(queue_like, sync_ttft=500.0)
    res = sweep(measure, SweepConfig(slo=parse_slo("ttft_p99_ms=100")))
    assert res.capacity.status == "unmet_at_synchronous" and res.capacity.low_req_s == 0.0
    assert "ttft_p99_ms = 500 > 100" in res.capacity.notes[0]
    assert len(calls) == 2


def test_above_saturation_when_every_rate_meets():
    measure, calls = model(lambda r: 60.0)
    res = sweep(measure, SweepConfig(slo=parse_slo("ttft_p99_ms=100")))
    cap = res.capacity
    assert cap.status == "above_saturation" and cap.low_req_s == R_SAT and cap.high_req_s is None
    assert calls[-1].request_rate == R_SAT and len(calls) == 6
    assert cap.describe().startswith(">= 20 req/s")


def test_none_met_bisects_below_the_grid():
    # every open-loop rate above 2 req/s misses: the search goes below the synchronous rate
    measure, calls = model(lambda r: 50.0 if r <= 2.0 else 500.0)
    res = sweep(measure, SweepConfig(slo=parse_slo("ttft_p99_ms=100"), precision=0.1,
                                     max_points=20))
    cap = res.capacity
    assert cap.status == "bracketed" and cap.low_req_s <= 2.0 < cap.high_req_s
    assert cap.width <= 0.1


def test_failures_make_a_rate_miss():
    # fast survivors, but 5% of requests fail above 10 req/s: p99 allows 1%
    measure, _ = model(lambda r: 60.0, failed_of_rate=lambda r: 5 if r > 10.0 else 0)
    res = sweep(measure, SweepConfig(slo=parse_slo("ttft_p99_ms=100"), precision=0.05,
                                     max_points=20))
    assert res.capacity.status == "bracketed"
    assert res.capacity.low_req_s <= 10.0 < res.capacity.high_req_s


def test_non_monotone_rates_are_noted_and_the_first_crossing_kept():
    # a spike at 11.5-12.5 req/s only (noise): the bracket is its lower edge, the first crossing
    measure, _ = model(lambda r: 500.0 if 11.5 <= r <= 12.5 else 60.0)
    res = sweep(measure, SweepConfig(slo=parse_slo("ttft_p99_ms=100"), precision=0.05,
                                     max_points=20))
    cap = res.capacity
    assert cap.status == "bracketed" and cap.low_req_s < 11.5 <= cap.high_req_s <= 12.0
    assert any("met the SLOs again" in n for n in cap.notes)


def test_point_cap_leaves_the_bracket_unresolved():
    measure, calls = model(queue_like)
    res = sweep(measure, SweepConfig(slo=parse_slo("ttft_p99_ms=150"), precision=0.001,
                                     max_points=7))
    assert len(calls) == 7 and res.capacity.status == "unresolved"
    assert res.capacity.low_req_s <= true_capacity(150.0) <= res.capacity.high_req_s
    assert "asked 0.1%" in res.capacity.describe()


def test_without_slo_it_profiles_only():
    measure, calls = model(queue_like)
    res = sweep(measure, SweepConfig(grid_rates=4))
    assert res.capacity is None and len(calls) == 6
    assert [c.request_rate for c in calls[2:]] == [7.2, 10.4, 13.6, 16.8]
    assert all(p.check is None for p in res.points)


def test_no_grid_when_saturation_is_no_faster_than_one_at_a_time():
    measure, calls = model(lambda r: 60.0, r_sync=10.0, r_sat=9.5)
    res = sweep(measure, SweepConfig(slo=parse_slo("ttft_p99_ms=100")))
    assert any("gains nothing from concurrency" in n for n in res.notes)
    assert [c.request_rate for c in calls[2:]] == [10.0]  # only the top rate, tried once


def test_a_load_point_with_nothing_completed_is_a_clear_error():
    def measure(load: LoadPoint) -> dict:
        return {"request_throughput_req_s": None, "failure_reasons": {"http_404": 5},
                "completed": 0, "failed": 5}

    with pytest.raises(UserError, match=r"synchronous load point \(c=1\) completed no request "
                                        r"\(http_404 x5\)"):
        sweep(measure, SweepConfig())


@pytest.mark.parametrize("kw,needle", [({"precision": 0}, "--sweep-precision"),
                                       ({"grid_rates": -1}, "--sweep-rates"),
                                       ({"max_points": 3}, "--sweep-max-points"),
                                       ({"burstiness": 0}, "--burstiness")])
def test_bad_sweep_config(kw, needle):
    with pytest.raises(UserError, match=needle):
        SweepConfig(**kw)


def test_none_met_down_to_a_thousandth_of_saturation():
    measure, calls = model(lambda r: 500.0)
    res = sweep(measure, SweepConfig(slo=parse_slo("ttft_p99_ms=100"), max_points=30))
    cap = res.capacity
    assert cap.status == "none_met" and cap.low_req_s == 0.0
    assert cap.high_req_s < 2 * R_SAT * 1e-3 and calls[-1].request_rate == cap.high_req_s
    assert cap.describe().startswith("< ") and "no measured rate met" in cap.describe()


def test_point_cap_before_the_saturated_rate_is_tried():
    measure, calls = model(lambda r: 60.0)
    res = sweep(measure, SweepConfig(slo=parse_slo("ttft_p99_ms=100"), max_points=5))
    cap = res.capacity
    assert len(calls) == 5 and cap.status == "unresolved"
    assert cap.low_req_s == 16.0 and cap.high_req_s is None
    assert "bracket width open" in cap.describe() and "before the saturated rate was tried" in cap.notes[0]


def test_first_crossing_of_stored_verdicts():
    assert first_crossing([(4.0, True), (8.0, True), (12.0, False), (16.0, False)]) == (8.0, 12.0, ())
    lo, hi, notes = first_crossing([(4.0, True), (8.0, False), (12.0, True)])
    assert (lo, hi) == (4.0, 8.0) and "met the SLOs again (up to 12)" in notes[0]
    assert first_crossing([(4.0, True), (8.0, True)]) == (8.0, None, ())
    assert first_crossing([(4.0, False)]) == (None, 4.0, ())
    assert first_crossing([]) == (None, None, ())


def test_sweep_notes_a_sample_too_small_for_p99():
    measure, _ = model(queue_like)  # 100 requests completed per point: enough for p99
    assert not sweep(measure, SweepConfig(slo=parse_slo("ttft_p99_ms=150"))).notes

    def few(load: LoadPoint) -> dict:
        return {**measure(load), "completed": 30}

    res = sweep(few, SweepConfig(slo=parse_slo("ttft_p99_ms=150")))
    assert any("judged over 30 requests" in n for n in res.notes)


def _flagged(measure, above: float, status: str = "above_saturation", trend: str = "queue"):
    """The same server, its telemetry flagging every open-loop rate above `above` (a queue that
    grows throughout) while its latencies, read in the transient, still meet the SLOs."""
    def flagged(load: LoadPoint) -> dict:
        s = measure(load)
        r = load.request_rate
        bad = r is not None and math.isfinite(r) and r > above
        s["steadiness"] = {"status": status if bad else "steady", "reason": "queue grows",
                           "trends": {"queue": {"direction": "flat", "slope_per_s": 0.0},
                                      trend: {"direction": "up" if bad else "flat",
                                              "slope_per_s": 1.5 if bad else 0.0}}}
        s["above_saturation"] = bad and status == "above_saturation"
        return s
    return flagged


@pytest.mark.parametrize("status,trend", [("above_saturation", "queue"), ("unsteady", "queue"),
                                          ("unsteady", "ttft_ms")])
def test_a_point_whose_queue_rose_all_along_misses_its_slos(status, trend):
    # latencies meet the SLO at every rate (a transient read short), but the queue rises above
    # 12 req/s (or its TTFT, the wait for a slot): the capacity is bracketed below 12, never
    # "at least the saturated rate"
    measure, _ = model(lambda r: 60.0)
    cfg = SweepConfig(slo=parse_slo("ttft_p99_ms=100"), precision=0.05, max_points=30)
    res = sweep(_flagged(measure, 12.0, status, trend), cfg)
    cap = res.capacity
    assert cap.status == "bracketed", cap
    assert cap.low_req_s <= 12.0 < cap.high_req_s and cap.width <= 0.05
    missed = [p for p in res.points if p.check is not None and not p.check.met
              and p.role in ("grid", "refine")]
    assert missed and all(any(("saturation" in w or "rose all along" in w)
                              for w in p.check.reasons) for p in missed)
    # off: the same points meet, and the sweep reads "at least the saturated rate" as before
    res_off = sweep(_flagged(measure, 12.0, status, trend), SweepConfig(
        slo=parse_slo("ttft_p99_ms=100"), precision=0.05, max_points=30, saturation_fails=False))
    assert res_off.capacity.status == "above_saturation"
