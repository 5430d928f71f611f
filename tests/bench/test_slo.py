"""SLO keys (percentile and per-request, vLLM's spelling) and how a load-point summary is judged
against them: checked on hand-made summaries whose verdicts follow from the definitions."""

from __future__ import annotations

import math

import pytest

from servelab.bench.config import parse_goodput
from servelab.bench.slo import Slo, SloSet, parse_slo
from servelab.errors import UserError


def summary(ttft_p99=100.0, tpot_p99=20.0, completed=100, failed=0, goodput_slo=None,
            good=None, duration=10.0):
    lat = {"mean": None, "median": None, "p90": None, "p95": None, "std": None}
    return {
        "ttft_ms": {**lat, "p99": ttft_p99, "median": None if ttft_p99 is None else ttft_p99 / 2},
        "tpot_ms": {**lat, "p99": tpot_p99, "median": tpot_p99 / 2},
        "completed": completed, "failed": failed, "issued": completed + failed,
        "duration_s": duration, "goodput_slo": goodput_slo,
        "goodput_req_s": None if good is None else good / duration,
    }


def test_parse_percentile_and_aliases():
    s = parse_slo("ttft_p99_ms=2000,tpot_p99_ms=50")
    assert s is not None
    assert [(x.metric, x.stat, x.limit_ms) for x in s.slos] == [("ttft_ms", "p99", 2000.0),
                                                              ("tpot_ms", "p99", 50.0)]
    assert [x.key for x in s.slos] == ["ttft_p99_ms", "tpot_p99_ms"]
    # vLLM's goodput spelling: per-request SLOs, e2el is our e2e
    s = parse_slo("ttft:500 tpot:50 e2el:20000")
    assert s.per_request == {"ttft_ms": 500.0, "tpot_ms": 50.0, "e2e_ms": 20000.0}
    assert s.per_request == parse_goodput("ttft:500 tpot:50 e2el:20000")
    assert parse_slo("ttft_median_ms=5").slos[0].stat == "median"
    assert parse_slo("e2e_p50_ms=5").slos[0].stat == "median"
    assert parse_slo("itl_p95=5").slos[0] == Slo("itl_ms", "p95", 5.0)
    assert parse_slo("ttft:500,attainment=0.9").attainment == 0.9
    assert parse_slo("") is None and parse_slo(None) is None


@pytest.mark.parametrize("text,needle", [
    ("ttft_p99_ms", "KEY=VALUE"), ("foo_p99_ms=3", "not an SLO"), ("ttft_p99_ms=x", "not a number"),
    ("ttft_p99_ms=0", "> 0"), ("ttft_p99_ms=inf", "> 0"), ("itl_ms=5", "per-request"),
    ("attainment=0.5", "at least one"), ("ttft:1,attainment=0", "attainment"),
    ("ttft_ms=1,ttft=2", "more than once"),
])
def test_bad_slo_text_is_a_user_error(text, needle):
    with pytest.raises(UserError, match=needle):
        parse_slo(text)


def test_percentile_slo_check():
    s = parse_slo("ttft_p99_ms=200,tpot_p99_ms=50")
    ok = s.check(summary(ttft_p99=150, tpot_p99=25))
    assert ok.met and ok.ratio == pytest.approx(0.75) and not ok.reasons
    assert ok.values == {"ttft_p99_ms": 150, "tpot_p99_ms": 25}
    bad = s.check(summary(ttft_p99=300, tpot_p99=25))
    assert not bad.met and bad.ratio == pytest.approx(1.5)
    assert bad.reasons == ("ttft_p99_ms = 300 > 200",)
    assert s.check(summary(ttft_p99=200, tpot_p99=50)).met  # the limit itself is met


def test_failures_count_as_misses():
    s = parse_slo("ttft_p99_ms=200")
    # 1 failure in 100: within the 1% tail p99 leaves; 2 are not, however fast the rest were
    assert s.check(summary(completed=99, failed=1)).met
    two = s.check(summary(completed=98, failed=2))
    assert not two.met and math.isinf(two.ratio) and "2.0% of requests failed" in two.reasons[0]
    # the median tolerates up to half; the mean none
    assert parse_slo("ttft_median_ms=200").check(summary(completed=60, failed=40)).met
    assert not parse_slo("ttft_mean_ms=200").check(summary(completed=99, failed=1)).met
    # nothing completed: no statistic, and every request failed
    assert not s.check(summary(ttft_p99=None, completed=0, failed=5)).met


def test_missing_statistic_is_not_met_and_has_no_ratio():
    chk = parse_slo("tpot_p95_ms=10").check(summary())  # p95 None (an imported row)
    assert not chk.met and chk.ratio is None and "not measured" in chk.reasons[0]


def test_per_request_slo_uses_goodput_attainment():
    s = parse_slo("ttft:500 tpot:50")
    gp = {"ttft_ms": 500.0, "tpot_ms": 50.0}
    assert s.goodput() == gp
    assert s.check(summary(goodput_slo=gp, good=99)).met  # 99 of 100 issued met both
    miss = s.check(summary(goodput_slo=gp, good=97))
    assert not miss.met and miss.values["attainment"] == pytest.approx(0.97)
    assert miss.ratio == pytest.approx(3.0)  # 3% missed where 1% is allowed
    # failed requests are issued requests that did not meet them
    assert not s.check(summary(goodput_slo=gp, good=98, completed=98, failed=2)).met
    assert parse_slo("ttft:500 tpot:50 attainment=0.9").check(summary(goodput_slo=gp, good=90)).met
    # goodput counted against other limits cannot answer
    other = s.check(summary(goodput_slo={"ttft_ms": 400.0}, good=100))
    assert not other.met and other.ratio is None


def test_goodput_of_percentile_slos_uses_their_limits():
    s = parse_slo("ttft_p99_ms=2000,ttft_p50_ms=500,tpot_p99_ms=50,itl_p99_ms=80")
    assert s.goodput() == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    assert s.describe() == ("ttft_p99_ms <= 2000, ttft_median_ms <= 500, tpot_p99_ms <= 50, "
                            "itl_p99_ms <= 80")
    assert "for 0.99 of requests" in SloSet((Slo("ttft_ms", None, 1.0),)).describe()


def test_tail_slos_warn_about_small_samples():
    s = parse_slo("ttft_p99_ms=200,tpot_p95_ms=50,e2e_median_ms=900")
    assert s.sample_note(100) is None
    note = s.sample_note(40)
    assert note.startswith("ttft_p99_ms judged over 40 requests") and ">= 100" in note
    assert "tpot_p95_ms, " not in note
    assert "ttft_p99_ms, tpot_p95_ms" in s.sample_note(10) and parse_slo("ttft:5").sample_note(3) is None
